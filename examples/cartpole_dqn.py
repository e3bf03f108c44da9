"""Double DQN with a target network on CartPole-v1, in PyTorch: one file to copy and make your own.

    pip install -e '.[examples]'
    python -m tinyverse examples/cartpole_dqn.py run --target-return 475      # 1 player + 1 trainer
    python -m tinyverse examples/cartpole_dqn.py play -b 1 &                  # or the parts
    python -m tinyverse examples/cartpole_dqn.py train -b 16 &
    python -m tinyverse examples/cartpole_dqn.py eval -n 20 --no-record
    python -m tinyverse examples/cartpole_dqn.py train --set learning_rate=1e-3   # options: --set NAME=VALUE

Players act epsilon-greedily and record sessions of 32 ticks; the trainer
regresses Q on 5-step returns with a Polyak-averaged target net, both held by
the core's loops to the pace the options declare (``updates_per_step``,
``learning_starts``, ``pace_slack``). Hidden layers are LayerNorm-ed, the step
size decays, and each player of a fleet ends at its own epsilon (Ape-X). It
imports tinyverse, NumPy, PyTorch and Gymnasium only. Measured: docs/examples.rst.

Double DQN: https://arxiv.org/abs/1509.06461 (the online net picks the next
action, the target net values it). Ape-X: https://arxiv.org/abs/1803.00933.
LayerNorm in Q-learning (PQN): https://arxiv.org/abs/2407.04811.
"""

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import tinyverse
from tinyverse import explore, nstep_transitions

torch.set_num_threads(1)  # players and trainers share the cores: torch's default made a run 4x slower


@dataclass
class Args(tinyverse.Settings):
    TUNABLE = ("learning_rate", "lr_end", "lr_updates", "tau", "eps_start", "eps_updates")  # tune --set: read each step
    # the core's settings (tinyverse.Settings) this file sets otherwise
    session_length: int = 32
    buffer_size: int | None = 10_000
    """sessions the database keeps: 320k transitions (80k: a solved fleet forgot what failing looks like)"""
    train_batch_size: int = 16
    """default of train -b: 512 transitions an update"""
    prefetch: int = 0
    """batches are cheap and updates short: no prefetch thread competing for the GIL (1.3-1.6x)"""
    local_params: tuple[str, ...] = ("target.*",)
    """with several trainers each keeps its own target net"""
    # with train -b 16 (512 transitions an update): 128 replayed transitions per env step (SB3's zoo: 32);
    # in simulation 0.5 updates an env step learned slower per update, 0.125 no faster
    updates_per_step: float | None = 0.25
    """the pace: trainer updates per env step played"""
    learning_starts: int = 500
    """the pace: env steps played before the first update"""
    pace_slack: int = 500
    """the pace: env steps either side may run ahead of updates_per_step before it waits"""
    # its own
    env_id: str = "CartPole-v1"
    """the Gymnasium environment"""
    hidden: int = 64
    """units in each of the two hidden layers"""
    layer_norm: bool = True
    """normalize each hidden layer's pre-activations (LayerNorm): a larger step size stays near-stable"""
    learning_rate: float = 4e-3
    """Adam step size at the start (without LayerNorm: 2e-3)"""
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


class CartPoleDQN(tinyverse.Experiment):
    def __init__(self, args: Args | None = None):
        self.args = args or Args()
        super().__init__(self.args)  # the core reads its settings (session_length, the pace, ...) there
        env = self.make_env()
        assert isinstance(env.action_space, gym.spaces.Discrete), "only discrete actions"
        n_obs, n_act = env.observation_space.shape[0], int(env.action_space.n)
        env.close()
        h = self.args.hidden

        def layer(n_in):  # without LayerNorm the params keep their former names (0, 2, 4)
            return [nn.Linear(n_in, h), *([nn.LayerNorm(h)] if self.args.layer_norm else []), nn.ReLU()]

        def net():
            return nn.Sequential(*layer(n_obs), *layer(h), nn.Linear(h, n_act))

        self.q, self.target = net(), net()
        self.target.load_state_dict(self.q.state_dict())
        self.updates = 0  # trainer updates so far, shared through params
        self.rng = np.random.default_rng()
        # Ape-X: each player of a fleet ends at its own epsilon, spread geometrically around eps_end
        # (a lone player, or one started by hand, plays eps_end), so some of the data keeps failing
        self.eps_final = explore.apex_epsilon(self.args.eps_end, self.args.eps_spread, *explore.player_slot())

    def make_env(self, render_mode=None):
        return gym.make(self.args.env_id, render_mode=render_mode)

    # -- players ----------------------------------------------------------------
    def epsilon(self) -> float:
        # Decays with trainer updates, not env steps: exploration should shrink as the
        # Q-function learns, and it learns per update. Tied to env steps, a fast player
        # (or ten players) would reach eps_end before the net knows anything.
        return explore.linear(self.args.eps_start, self.eps_final, self.updates / self.args.eps_updates)

    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        net = self.target if greedy and self.args.greedy_target else self.q
        q = net(torch.as_tensor(observations, dtype=torch.float32)).numpy()
        return explore.epsilon_greedy(q, 0.0 if greedy else self.epsilon(), self.rng), memory

    def session_info(self):
        return {"epsilon": self.epsilon()}

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=self.args.learning_rate, fused=True)
        self.pairs = list(self.target.parameters()), list(self.q.parameters())  # for Polyak averaging

    def train_step(self, batch):
        a = self.args
        for group in self.optimizer.param_groups:  # the schedule follows the shared update count
            group["lr"] = explore.linear(a.learning_rate, a.lr_end, self.updates / a.lr_updates)
        t = nstep_transitions(batch, a.n_step, a.gamma)  # cut at episode ends and at the end of the session
        # float32 as act's: an env of integer observations (MiniGrid's uint8 image) trains too
        obs = torch.as_tensor(t.observations, dtype=torch.float32).flatten(0, 1)
        next_obs = torch.as_tensor(t.next_observations, dtype=torch.float32).flatten(0, 1)
        returns, discount = torch.as_tensor(t.returns).flatten(), torch.as_tensor(t.discounts).flatten()
        actions = torch.as_tensor(t.actions).flatten().long()
        with torch.no_grad():
            best = self.q(next_obs).argmax(1, keepdim=True)  # double DQN: the online net picks,
            target = returns + discount * self.target(next_obs).gather(1, best).squeeze(1)  # the target values
        q = self.q(obs).gather(1, actions[:, None]).squeeze(1)
        loss = F.smooth_l1_loss(q, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.updates += max(1, round(len(batch["rewards"]) / a.train_batch_size))  # counted as the pace counts
        with torch.no_grad():  # Polyak averaging of the target net
            torch._foreach_lerp_(*self.pairs, a.tau)
        return {"loss": loss.item(), "q": q.mean().item()}

    # -- params -----------------------------------------------------------------
    def get_params(self):  # both networks' weights as NumPy copies, named q.* and target.*
        nets = {"q": self.q, "target": self.target}
        params = {f"{name}.{k}": v.numpy().copy() for name, net in nets.items() for k, v in net.state_dict().items()}
        return params | {"updates": np.array(self.updates, np.int64)}

    def set_params(self, params):
        for name, net in {"q": self.q, "target": self.target}.items():
            net.load_state_dict({k: torch.from_numpy(params[f"{name}.{k}"]) for k in net.state_dict()})
        self.updates = int(params["updates"])


def make_experiment(args: Args):
    return CartPoleDQN(args)
