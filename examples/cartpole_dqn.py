"""Double DQN with a target network on CartPole-v1, in PyTorch (CleanRL style: one file).

    pip install -e '.[examples]'
    python -m tinyverse examples/cartpole_dqn.py play -b 1 &
    python -m tinyverse examples/cartpole_dqn.py train -b 16 &
    python -m tinyverse examples/cartpole_dqn.py eval -n 20 --no-record
    python -m tinyverse examples/cartpole_dqn.py train --set learning_rate=1e-3   # options: --set NAME=VALUE

Players and the trainer run decoupled; the core's loops hold the pace this file
declares (``updates_per_step``, ``learning_starts``, ``pace_slack``, options
below), counted in env steps: lead = (env steps - learning_starts) - updates /
updates_per_step. A player waits while lead > pace_slack, so it does not fill
the replay buffer with a stale policy while the trainer falls behind (on a busy
machine the trainer slows down first); the trainer waits until learning_starts
env steps are played and while lead < -pace_slack, so it never grinds on a
handful of early sessions (overfitting, divergence).

The defaults reproduce this file's earlier hand-written pacing. A player used to
wait while env steps > 1000 + 4 x updates: 0.25 updates an env step, 1000 env
steps ahead, which is what held on 2 cores, where the trainer is the bottleneck
(updates_per_step 0.25, learning_starts + pace_slack = 1000). The trainer used to
wait while updates > 0.5 x env steps, a bound it rarely met; it now waits at
0.25 x env steps (learning_starts = pace_slack = 500) and starts after 500 env
steps, where it used to start at its first batch (16 sessions: 512 env steps).

Staying solved: a fleet left running (2 x ``play -b 4``, ``train -b 32``)
solved CartPole within a minute, then its greedy evals kept dropping to
100-250 and coming back. Three causes, three fixes first (``bench/stays.py``):
at a constant step size of 2e-3 the Q-values of a solved policy drift (the
step size now decays linearly to 1e-4 over 20,000 updates, counted by all
trainers and kept in the params, so a restarted trainer resumes the schedule);
the replay buffer (80k transitions, under a minute of this fleet's play) soon
held nothing but balanced poles (it keeps 320k now); and ``train -b 32``
replayed every transition twice as often as the pace declared for 16 sessions
(the core's pace now counts an update by its sessions, and so do this file's
schedules). Without kills the last two sets of three runs ended at 486, 500,
500 and 500, 500, 500, but 2 of the 12 runs with 10 random kill -9 a run fell
to 10 and 271, gradually over 60-100 s and not at a kill (one with no trainer
restart at all). A fourth fix: every player explored at the same final epsilon
(0.02), so once solved the buffer held almost no failing states; the likely
mechanism (not measured directly) is that the Q-values of both actions then
drift together until the greedy policy tips over. Now player i of n ends at
its own epsilon, spread geometrically around eps_end as Ape-X does (2 players:
0.092 and 0.0044; a lone player keeps eps_end). Then 500, 500, 500 with 10
kills a run, every eval after the first solve at 500 (on seeds 3-5 too), and
500, 500, 500 without kills (1 of 35 evals after the first solve under 475).

Double DQN: https://arxiv.org/abs/1509.06461 (the online net picks the next
action, the target net values it). Ape-X: https://arxiv.org/abs/1803.00933.
"""

import os
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import tinyverse

# torch's default thread count made a DQN run 4x slower with several processes on 2 cores
torch.set_num_threads(1)


@dataclass
class Args:
    env_id: str = "CartPole-v1"
    """the Gymnasium environment"""
    hidden: int = 64
    """units in each of the two hidden layers"""
    learning_rate: float = 2e-3
    """Adam step size at the start"""
    lr_end: float = 1e-4
    """Adam step size after ``lr_updates`` updates, reached linearly (keeps a solved policy from drifting off)"""
    lr_updates: int = 20_000
    """updates of train_batch_size sessions over which the step size decays (all trainers', in the params)"""
    gamma: float = 0.99
    """discount factor"""
    n_step: int = 5
    """n-step returns, cut at episode ends and at the end of the session"""
    tau: float = 0.01
    """target net update rate: target += tau x (online - target) after every update"""
    eps_start: float = 1.0
    """exploration epsilon of players before any update"""
    eps_end: float = 0.02
    """exploration epsilon of a lone player after ``eps_updates`` updates"""
    eps_spread: float = 7.0
    """Ape-X: player i of n ends at eps_end ** ((1 + spread q) / (1 + spread / 2)), q = (i + 1/2) / n"""
    eps_updates: int = 2000
    """updates of train_batch_size sessions over which epsilon decays linearly"""
    greedy_target: bool = False
    """greedy play (eval) uses the target net, the online net averaged over ~1/tau updates, not its last step"""
    # with train -b 16 (512 transitions an update): 128 replayed transitions per env step (SB3's zoo: 32);
    # in simulation 0.5 updates an env step learned slower per update, 0.125 no faster
    updates_per_step: float = 0.25
    """the pace: trainer updates per env step played"""
    learning_starts: int = 500
    """the pace: env steps played before the first update"""
    pace_slack: int = 500
    """the pace: env steps either side may run ahead of updates_per_step before it waits"""


class CartPoleDQN(tinyverse.Experiment):
    local_params = ("target.*",)  # with several trainers each keeps its own target net
    session_length = 32
    buffer_size = 10_000  # sessions: 320k transitions (80k: a solved fleet forgot what failing looks like)
    play_batch_size = 1  # play -b / run -b default
    prefetch = 0  # batches are cheap and updates short: no prefetch thread competing for the GIL (1.3-1.6x)
    train_batch_size = 16  # train -b / run --train-batch default: 512 transitions an update

    def __init__(self, db=None, args: Args | None = None):
        super().__init__(db)
        self.args = args or Args()
        env = self.make_env()
        assert isinstance(env.action_space, gym.spaces.Discrete), "only discrete actions"
        n_obs, n_act = env.observation_space.shape[0], int(env.action_space.n)
        env.close()
        h = self.args.hidden

        def net():
            return nn.Sequential(nn.Linear(n_obs, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, n_act))

        self.q, self.target = net(), net()
        self.target.load_state_dict(self.q.state_dict())
        self.n_act = n_act
        self.updates = 0  # trainer updates so far, shared through params
        self.rng = np.random.default_rng()
        # Ape-X: each player of a fleet ends at its own epsilon, spread geometrically around eps_end
        # (a lone player, or one started by hand, plays eps_end), so some of the data keeps failing
        index = int(os.environ.get("TINYVERSE_WORKER_INDEX", 0))  # set by run (and bench/stays.py)
        count, spread = int(os.environ.get("TINYVERSE_WORKER_COUNT", 1)), self.args.eps_spread
        self.eps_final = self.args.eps_end ** ((1 + spread * (index + 0.5) / count) / (1 + spread / 2))
        # the pace the core's loops hold (see the module docstring)
        self.updates_per_step = self.args.updates_per_step
        self.learning_starts, self.pace_slack = self.args.learning_starts, self.args.pace_slack

    def make_env(self, render_mode=None):
        return gym.make(self.args.env_id, render_mode=render_mode)

    # -- players ----------------------------------------------------------------
    def epsilon(self) -> float:
        # Decays with trainer updates, not env steps: exploration should shrink as the
        # Q-function learns, and it learns per update. Tied to env steps, a fast player
        # (or ten players) would reach eps_end before the net knows anything.
        a = self.args
        return self.eps_final + (a.eps_start - self.eps_final) * max(0.0, 1 - self.updates / a.eps_updates)

    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        net = self.target if greedy and self.args.greedy_target else self.q
        actions = net(torch.as_tensor(observations, dtype=torch.float32)).argmax(1).numpy()
        if not greedy:
            explore = self.rng.random(len(actions)) < self.epsilon()
            actions = np.where(explore, self.rng.integers(self.n_act, size=len(actions)), actions)
        return actions, memory

    def session_info(self):
        return {"epsilon": self.epsilon()}

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=self.args.learning_rate, fused=True)
        self.pairs = list(self.target.parameters()), list(self.q.parameters())  # for Polyak averaging

    def train_step(self, batch):
        a = self.args
        for group in self.optimizer.param_groups:  # the schedule follows the shared update count
            group["lr"] = a.lr_end + (a.learning_rate - a.lr_end) * max(0.0, 1 - self.updates / a.lr_updates)
        obs = torch.as_tensor(batch["observations"][:, :-1]).flatten(0, 1)
        actions = torch.as_tensor(batch["actions"]).flatten().long()
        returns, discount, next_obs = (torch.as_tensor(x).flatten(0, 1) for x in n_step(batch, a.n_step, a.gamma))
        with torch.no_grad():
            best = self.q(next_obs).argmax(1, keepdim=True)  # double DQN: the online net picks,
            target = returns + discount * self.target(next_obs).gather(1, best).squeeze(1)  # the target values
        q = self.q(obs).gather(1, actions[:, None]).squeeze(1)
        loss = F.smooth_l1_loss(q, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += max(1, round(len(batch["rewards"]) / self.train_batch_size))  # counted as the pace counts
        with torch.no_grad():  # Polyak averaging of the target net
            torch._foreach_lerp_(*self.pairs, a.tau)
        return {"loss": loss.item(), "q": q.mean().item()}

    # -- params -----------------------------------------------------------------
    def get_params(self):
        params = {f"q.{k}": v.numpy().copy() for k, v in self.q.state_dict().items()}
        params |= {f"target.{k}": v.numpy().copy() for k, v in self.target.state_dict().items()}
        return params | {"updates": np.array(self.updates, np.int64)}

    def set_params(self, params):
        for name, net in (("q", self.q), ("target", self.target)):
            net.load_state_dict({k: torch.from_numpy(params[f"{name}.{k}"]) for k in net.state_dict()})
        self.updates = int(params["updates"])


def n_step(batch, n: int, gamma: float):
    """n-step returns of each tick, their bootstrap discount (0 after termination) and observation.

    A return stops early where the episode ends (truncated: bootstrap from the
    final observation; terminated: don't) and at the end of the session, where
    ``observations[:, T]`` is the observation to bootstrap from.
    """
    r, terminated = batch["rewards"], batch["terminated"]
    ended = terminated | batch["truncated"]
    # one-step successor of each tick: after an episode ends at tick t, observations[:, t+1]
    # starts the next episode and the real successor is final_observations[:, t]
    successor = np.where(ended[..., None], batch["final_observations"], batch["observations"][:, 1:])
    B, T = r.shape
    returns, discount = np.zeros((B, T), np.float32), np.ones((B, T), np.float32)
    last = np.broadcast_to(np.arange(T), (B, T))  # the last tick summed into each return
    running = np.ones((B, T), bool)
    for k in range(n):
        tick = np.minimum(np.arange(T) + k, T - 1)
        on = running & (np.arange(T) + k < T)
        returns += np.where(on, discount * r[:, tick], 0)
        discount = np.where(on, discount * gamma, discount)
        last = np.where(on, tick, last)
        running = on & ~ended[:, tick]
    rows = np.arange(B)[:, None]
    # bootstrap on truncation (time limit), never on termination (the pole fell)
    return returns, discount * ~terminated[rows, last], successor[rows, last]


def make_experiment(db, args: Args):
    return CartPoleDQN(db, args)
