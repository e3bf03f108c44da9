"""DQN with the improvements that matter, for vector observations and discrete actions (CleanRL style).

    pip install -e '.[examples]'                         # LunarLander: '.[examples,box2d]'
    python -m tinyverse examples/dqn.py play --set env_id=LunarLander-v3 &
    python -m tinyverse examples/dqn.py train &          # adopts the options the first worker stored
    python -m tinyverse examples/dqn.py eval -n 10 --no-record
    python -m tinyverse examples/dqn.py train --set env_id=Acrobot-v1 --set per=0 --prefix acrobot-no-per

Configuration: the options (``Args``) come from ``--set name=value``. ``env_id`` picks the
environment and its preset (CartPole-v1, the default, Acrobot-v1, LunarLander-v3; RL-Zoo's SB3 DQN
hyperparameters where they apply); every other ``--set`` overrides the preset, e.g. ``--set per=0``,
``--set n_step=1``, ``--set learning_rate=1e-3``. The first worker of a run stores the resolved
options in the database and the others adopt them; a worker whose ``--set`` disagrees stops with
an error (``--prefix`` keeps differently configured runs apart). Each improvement has a switch, so its
effect can be measured (``bench/dqn.py --ablate``):

- double Q-learning (``double``): the online net picks the next action, the target net values
  it. https://arxiv.org/abs/1509.06461
- dueling heads (``dueling``): Q = V + A - mean(A), each stream with its own hidden layer
  (``shared_hidden``: one layer shared by both, half the FLOPs).
  https://arxiv.org/abs/1511.06581
- n-step returns (``n_step``), computed inside a session and never across an episode end: a
  terminated episode adds no bootstrap, a truncated one bootstraps from its final observation,
  and the last ticks of a session use the m < n steps left (a correct, shorter target).
- prioritized replay (``per``), design below. https://arxiv.org/abs/1511.05952
- Ape-X exploration (https://arxiv.org/abs/1803.00933): player i of n plays with its own final
  epsilon, spread geometrically around ``eps_end``:
  eps_i = eps_end ** ((1 + apex_alpha * q_i) / (1 + apex_alpha / 2)), q_i = (i + 1/2) / n, so a
  lone player uses ``eps_end``, and many span eps_end ** 0.22 .. eps_end ** 1.78 (0.49 .. 0.003
  for CartPole's 0.04; Ape-X's 360 actors spanned 0.4 .. 0.0007). Ape-X's own formula,
  0.4 ** (1 + 7 i / (n - 1)), gave one of 2 players epsilon 0.4 (half the data 40% random); with
  it 2 players took about 2x the time of one to solve CartPole (``bench/dqn.py``). i and n come
  from TINYVERSE_WORKER_INDEX / TINYVERSE_WORKER_COUNT that ``run`` sets (a random i of
  ``apex_players`` when unset). Epsilon decays linearly from ``eps_start`` to eps_i with trainer
  updates and is stored with every session (``info.epsilon``).

Prioritized replay lives in the TRAINER, not the database. Many players write, one trainer samples,
and only the trainer knows TD errors: keeping priorities next to it costs no round trip per update,
needs no new database primitive, and keeps the database a dumb ring of sessions that every backend
implements alike. The trainer keeps a sum tree over the ring of session ids (leaf = id % capacity).
Before each batch, ``sample`` reads ``db.session_range()`` (one cheap call): ids newer than any it
has seen enter with the maximum priority so far, ids below the range (evicted) drop to zero. It
then draws a batch of ids from the tree, stratified, in O(log N) each, and fetches them with one
``db.get_batch(ids)``; ids evicted in between are zeroed and the batch redrawn. ``train_step`` sets the
priorities of the batch's ids (``batch["id"]``) from their TD errors, R2D2's mix for sequences
p = (eta max|d| + (1 - eta) mean|d| + eps) ** alpha (https://openreview.net/forum?id=r1lyTjAqYX),
and weighs each session's loss by its importance-sampling weight (N P)^-beta / max, with beta
annealed to 1. A restarted trainer starts with every stored session at the maximum priority. A
second trainer would keep its own tree: fine for parameter-server style training, where each
trainer then prioritizes by its own errors.

Pacing: players and trainers run decoupled; the core's loops hold the replay ratio (updates per env
step) that the baseline uses, as declared by the options ``replay_ratio``, ``learning_starts`` and
``pace_slack`` (the Experiment's ``updates_per_step``, ``learning_starts`` and ``pace_slack``). With
lead = (env steps - learning_starts) - updates / replay_ratio, a player waits while lead > pace_slack
(this file's own pacing loop did exactly that before), and the trainer waits until learning_starts
env steps are played and while lead < -pace_slack: updates <= replay_ratio x (env steps -
learning_starts + pace_slack). That is the bound this file's trainer kept before (updates <=
replay_ratio x env steps) when learning_starts = pace_slack, as in the CartPole preset; the
Acrobot/LunarLander preset (learning_starts 0, as SB3's zoo) lets the trainer run up to
replay_ratio x pace_slack updates ahead of it.

More players (``batch_per_player``, on by default; ``--set batch_per_player=false`` turns it off):
the trainer's batch is ``batch_sessions`` per live player, and the core's pace counts an update of
n x ``batch_sessions`` as n updates, as do this file's schedules (epsilon, PER's beta, the target
net's copies): every transition is sampled as often, in fewer, larger updates, which cost less than
their size on a CPU. Measured on 2 cores (``bench/dqn.py``, 3 seeds, median time to solve): CartPole
1 player 38 s, 2 players 30 s, 2 players with larger batches 18 s; Acrobot 68, 58 and 56 s.
The whole matrix in one script (2026-12-01, 3 seeds, 2 cores; SB3's time = 1): 1 player
CartPole 1.61, Acrobot 0.63, LunarLander 0.92 (2 of 3 solved); 2 players 1.17, 0.76, 0.32 (docs:
examples; with the streams sharing their hidden layer, 1 player took 3.07, 0.81 and 0.83).
"""

import os
import random
import threading
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
    """the Gymnasium environment; it picks the preset of the options left unset (None)"""
    hidden: int = 256
    """units in each hidden layer"""
    learning_rate: float | None = None
    """Adam step size"""
    gamma: float = 0.99
    """discount factor"""
    session_length: int = 16
    """ticks per recorded session"""
    batch_sessions: int | None = None
    """sessions per minibatch; each brings session_length transitions"""
    buffer_transitions: int | None = None
    """transitions kept in the database (buffer_transitions // session_length sessions)"""
    replay_ratio: float | None = None
    """trainer updates per env step (SB3: gradient_steps / train_freq)"""
    learning_starts: int | None = None
    """env steps played before the first update (players run ahead by this much)"""
    pace_slack: int = 1000
    """env steps a player may run ahead of updates / replay_ratio"""
    batch_per_player: bool = True
    """batch_sessions per live player: more players, larger updates (counted so by every schedule)"""
    target_every: int | None = None
    """updates between copies of the online net into the target net"""
    max_grad_norm: float = 10.0
    """gradient clipping (global L2 norm)"""
    eps_start: float = 1.0
    """exploration epsilon before any update"""
    eps_end: float | None = None
    """final epsilon of a lone player"""
    exploration_steps: int | None = None
    """env steps over which epsilon decays (counted as updates / replay_ratio)"""
    apex_alpha: float = 7.0
    """Ape-X: spread of the players' epsilons"""
    apex_players: int = 8
    """Ape-X: n assumed when TINYVERSE_WORKER_COUNT is unset (i is then drawn at random)"""
    double: bool = True
    """double Q-learning"""
    dueling: bool = True
    """dueling value/advantage heads"""
    shared_hidden: bool = False
    """the dueling streams share the second hidden layer (half the FLOPs; more env steps to solve here)"""
    n_step: int = 3
    """n of n-step returns (1: plain one-step TD)"""
    per: bool = True
    """prioritized replay (else uniform)"""
    per_alpha: float = 0.6
    """how much prioritization is used (0: uniform)"""
    per_beta: float = 0.4
    """importance-sampling exponent at the start, annealed to 1"""
    per_beta_updates: int | None = None
    """updates over which beta reaches 1"""
    per_eta: float = 0.9
    """session priority mixes max and mean |TD error| (R2D2)"""
    per_eps: float = 1e-3
    """added to |TD error| so that no session is never replayed"""
    seed: int = -1
    """seed of the networks' initial weights (-1: random)"""

    def __post_init__(self):
        """Fill the options left unset from the env_id's preset: the stored options are complete."""
        for key, value in {**DEFAULTS, **PRESETS.get(self.env_id, {})}.items():
            if getattr(self, key) is None:
                setattr(self, key, value)


# RL-Zoo's SB3 DQN hyperparameters (hyperparams/dqn.yml), in this file's terms: CartPole-v1's
# (and any other env_id's) are DEFAULTS, the others' differ where PRESETS says
DEFAULTS = dict(
    learning_rate=2.3e-3,
    batch_sessions=4,
    buffer_transitions=100_000,
    replay_ratio=0.5,
    learning_starts=1000,
    target_every=128,
    eps_end=0.04,
    exploration_steps=8000,
    per_beta_updates=20_000,
)
PRESETS = {
    "CartPole-v1": {},
    "Acrobot-v1": dict(
        learning_rate=6.3e-4,
        batch_sessions=8,
        buffer_transitions=50_000,
        replay_ratio=1.0,
        learning_starts=0,
        target_every=250,
        eps_end=0.1,
        exploration_steps=12_000,
        per_beta_updates=100_000,
    ),
}
PRESETS["LunarLander-v3"] = PRESETS["Acrobot-v1"]


def apex_epsilon(args: Args, index: int, count: int) -> float:
    """Final epsilon of player ``index`` of ``count``: Ape-X's spread, centred on eps_end (see above)."""
    quantile = (index + 0.5) / count
    return args.eps_end ** ((1 + args.apex_alpha * quantile) / (1 + args.apex_alpha / 2))


def nstep_targets(observations, final_observations, rewards, terminated, truncated, n: int, gamma: float):
    """n-step returns inside sessions: (returns, bootstrap observations, discounts, their ticks).

    For tick t the return sums rewards of ticks t..t+m-1, where m <= n stops at the end of the
    episode (if it ends in the window) or of the session. The target is then
    ``returns + discounts * V(bootstrap observations)``: discount gamma^m, zero after a
    termination; the observation after tick t+m-1, the episode's final one after a truncation.
    The last array says where each bootstrap observation is in ``observations`` (t+m), or -1
    where it is a final observation.
    """
    B, T = rewards.shape
    ended = terminated | truncated
    returns = np.zeros((B, T), np.float32)
    discounts = np.zeros((B, T), np.float32)
    boot = np.zeros_like(final_observations)
    index = np.full((B, T), -1)
    live = np.ones((B, T), bool)
    t = np.arange(T)
    for k in range(n):
        i = np.minimum(t + k, T - 1)
        inside = (t + k < T)[None]
        step = live & inside
        returns += np.where(step, gamma**k * rewards[:, i], 0)
        e = ended[:, i]
        stop = step & (e | (k == n - 1) | (t + k == T - 1)[None])
        discounts = np.where(stop, np.where(terminated[:, i], 0.0, gamma ** (k + 1)), discounts)
        after = np.where(e[..., None], final_observations[:, i], observations[:, i + 1])
        boot = np.where(stop[..., None], after, boot)
        index = np.where(stop, np.where(e, -1, i + 1), index)
        live &= ~stop
    return returns, boot, discounts.astype(np.float32), index


class SumTree:
    """Priorities on ``capacity`` leaves in a binary sum tree: O(log N) update and draw."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.size = 1 << max(0, (capacity - 1).bit_length())  # leaves: a power of two
        self.tree = np.zeros(2 * self.size)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, leaves: np.ndarray) -> np.ndarray:
        return self.tree[np.asarray(leaves) + self.size]

    def set(self, leaves: np.ndarray, priorities: np.ndarray) -> None:
        """Set leaves, then re-add their ancestors level by level (log N levels)."""
        idx = np.asarray(leaves, np.int64) + self.size
        self.tree[idx] = priorities
        while len(idx) and idx[0] > 1:
            idx = np.unique(idx // 2)
            self.tree[idx] = self.tree[2 * idx] + self.tree[2 * idx + 1]

    def find(self, values: np.ndarray) -> np.ndarray:
        """Leaf of each value in [0, total): the leaf whose cumulative range holds it."""
        v = np.minimum(np.asarray(values, np.float64), np.nextafter(self.total, 0))
        idx = np.ones(len(v), np.int64)
        while idx[0] < self.size:
            left = self.tree[2 * idx]
            right = (v >= left) & (self.tree[2 * idx + 1] > 0)  # never into an empty subtree
            v = np.where(right, v - left, v)
            idx = 2 * idx + right
        return idx - self.size


class PrioritizedReplay:
    """The trainer's priorities over the database's ring of session ids (see the module docstring)."""

    def __init__(self, capacity: int, alpha: float, rng: np.random.Generator | None = None):
        self.tree = SumTree(capacity)
        self.owner = np.zeros(capacity, np.int64)  # id held by each leaf (0: none)
        self.lo, self.hi = 1, 0  # ids known to be stored
        self.alpha, self.max_priority = alpha, 1.0
        self.rng = rng or np.random.default_rng()
        self.lock = threading.Lock()  # sample() runs in the prefetch thread, update() in training

    def __len__(self) -> int:
        return max(self.hi - self.lo + 1, 0)

    def sync(self, lo: int, hi: int) -> None:
        """Follow the stored range: evicted ids drop out, new ids enter at the max priority."""
        with self.lock:
            if hi - lo + 1 > self.tree.capacity:
                self._grow(2 * (hi - lo + 1))
            if hi < lo:  # cleared
                self._forget(np.arange(self.lo, self.hi + 1))
            else:
                self._forget(np.arange(self.lo, min(lo - 1, self.hi) + 1))
                new = np.arange(max(self.hi + 1, lo), hi + 1)
                slots = new % self.tree.capacity
                self.owner[slots] = new
                self.tree.set(slots, np.full(len(new), self.max_priority))
            self.lo, self.hi = lo, hi

    def draw(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` ids drawn in proportion to priority (stratified), and their probabilities."""
        with self.lock:
            total = self.tree.total
            if total <= 0:
                return np.zeros(0, np.int64), np.zeros(0)
            leaves = self.tree.find((np.arange(n) + self.rng.random(n)) * (total / n))
            return self.owner[leaves], self.tree.get(leaves) / total

    def update(self, ids: np.ndarray, errors: np.ndarray) -> None:
        """Set priorities (errors ** alpha) of ids still stored; a later id in the same slot is left alone."""
        with self.lock:
            ids = np.asarray(ids, np.int64)
            slots = ids % self.tree.capacity
            keep = self.owner[slots] == ids
            p = np.asarray(errors, np.float64)[keep] ** self.alpha
            self.tree.set(slots[keep], p)
            if len(p):
                self.max_priority = max(self.max_priority, float(p.max()))

    def forget(self, ids) -> None:
        with self.lock:
            self._forget(np.asarray(ids, np.int64))

    def _forget(self, ids: np.ndarray) -> None:
        slots = ids % self.tree.capacity
        keep = self.owner[slots] == ids
        self.owner[slots[keep]] = 0
        self.tree.set(slots[keep], np.zeros(int(keep.sum())))

    def _grow(self, capacity: int) -> None:
        ids = self.owner[self.owner > 0]
        priorities = self.tree.get(ids % self.tree.capacity)
        self.tree, self.owner = SumTree(capacity), np.zeros(capacity, np.int64)
        self.owner[ids % capacity] = ids
        self.tree.set(ids % capacity, priorities)


class QNet(nn.Module):
    def __init__(self, n_obs: int, n_act: int, hidden: int, dueling: bool, shared_hidden: bool = False):
        super().__init__()
        self.dueling = dueling
        # the second hidden layer: one per dueling stream (as in the paper), or shared in the trunk
        shared = shared_hidden or not dueling
        first = [nn.Linear(n_obs, hidden), nn.ReLU()]  # layers made in order: a seed gives the same weights
        self.trunk = nn.Sequential(*first, *([nn.Linear(hidden, hidden), nn.ReLU()] if shared else []))

        def head(out):
            if shared:
                return nn.Linear(hidden, out)
            return nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out))

        if dueling:
            self.value, self.advantage = head(1), head(n_act)
        else:
            self.head = head(n_act)

    def forward(self, x):
        h = self.trunk(x)
        if not self.dueling:
            return self.head(h)
        a = self.advantage(h)
        return self.value(h) + a - a.mean(1, keepdim=True)


class DQN(tinyverse.Experiment):
    local_params = ("target.*",)  # with several trainers each keeps its own target net

    def __init__(self, db=None, args: Args | None = None):
        super().__init__(db)
        self.args = a = args or Args()
        assert a.n_step >= 1, "n_step must be at least 1"
        # the pace the core's loops hold (see the module docstring)
        self.updates_per_step, self.learning_starts, self.pace_slack = a.replay_ratio, a.learning_starts, a.pace_slack
        self.session_length = a.session_length
        self.buffer_size = max(1, a.buffer_transitions // a.session_length)
        self.train_batch_size, self.batch_per_player = a.batch_sessions, a.batch_per_player
        env = self.make_env()
        assert isinstance(env.action_space, gym.spaces.Discrete), "only discrete actions"
        assert len(env.observation_space.shape) == 1, "only vector observations"
        n_obs, self.n_act = env.observation_space.shape[0], int(env.action_space.n)
        env.close()
        if a.seed >= 0:
            torch.manual_seed(a.seed)
        self.q = QNet(n_obs, self.n_act, a.hidden, a.dueling, a.shared_hidden)
        self.target = QNet(n_obs, self.n_act, a.hidden, a.dueling, a.shared_hidden)
        self.target.load_state_dict(self.q.state_dict())
        self.updates = 0  # trainer updates so far (all trainers': params merge it), shared through params
        self.since_target = 0  # this trainer's updates since it refreshed its own target net
        self.rng = np.random.default_rng()
        self.per: PrioritizedReplay | None = None
        index, count = os.environ.get("TINYVERSE_WORKER_INDEX"), os.environ.get("TINYVERSE_WORKER_COUNT")
        if index is None or count is None:
            count = a.apex_players
            index = random.randrange(count)
        self.final_epsilon = apex_epsilon(a, int(index), int(count))

    def make_env(self, render_mode=None):
        return gym.make(self.args.env_id, render_mode=render_mode)

    # -- players ----------------------------------------------------------------
    def epsilon(self) -> float:
        # Decays with trainer updates, not this player's steps: a fast player (or ten) would
        # otherwise reach its final epsilon before the net knows anything.
        a = self.args
        progress = min(1.0, self.updates / max(a.exploration_steps * a.replay_ratio, 1))
        return a.eps_start + (self.final_epsilon - a.eps_start) * progress

    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        actions = self.q(torch.as_tensor(observations, dtype=torch.float32)).argmax(1).numpy()
        if not greedy:
            explore = self.rng.random(len(actions)) < self.epsilon()
            actions = np.where(explore, self.rng.integers(self.n_act, size=len(actions)), actions)
        return actions, memory

    def session_info(self):
        # called once per recorded round, before it is stored and before params are synced:
        # the epsilon this round played with
        return {"epsilon": self.epsilon()}

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        # fused: one kernel for all tensors, 3.2 -> 2.2 ms an update of the dueling net on one CPU thread
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=self.args.learning_rate, fused=True)

    def beta(self) -> float:
        a = self.args
        return min(1.0, a.per_beta + (1 - a.per_beta) * self.updates / max(a.per_beta_updates, 1))

    def sample(self, db, batch_size):
        if not self.args.per:
            return db.sample_batch(batch_size)
        lo, hi = db.session_range()
        if self.per is None:
            self.per = PrioritizedReplay(max(db.capacity() or self.buffer_size, hi - lo + 1, 1), self.args.per_alpha)
        self.per.sync(lo, hi)
        for _ in range(10):  # ids evicted since session_range() are zeroed and the batch redrawn
            ids, probs = self.per.draw(batch_size)
            batch = db.get_batch(ids)
            missing = set(ids.tolist()) - set(batch["id"].tolist() if batch else ())
            if not missing:
                break
            self.per.forget(sorted(missing))
        if not batch:
            return {}
        prob = dict(zip(ids.tolist(), probs.tolist(), strict=True))
        w = (len(self.per) * np.array([prob[i] for i in batch["id"].tolist()])) ** -self.beta()
        return batch | {"is_weight": (w / w.max()).astype(np.float32)}

    def train_step(self, batch):
        a = self.args
        B, T = batch["rewards"].shape
        returns, boot, discounts, index = nstep_targets(
            batch["observations"],
            batch["final_observations"],
            batch["rewards"],
            batch["terminated"],
            batch["truncated"],
            a.n_step,
            a.gamma,
        )
        # double Q: one forward of the online net over all T+1 observations gives both the
        # trained Q(s_t, a_t) and its pick at the bootstrap observations, which are s_{t+m}
        # except after a truncation (a final observation: forwarded apart, rarely)
        obs = torch.as_tensor(batch["observations"][:, : T + 1 if a.double else T], dtype=torch.float32)
        q_all = self.q(obs.flatten(0, 1)).view(B, obs.shape[1], -1)
        boot = torch.as_tensor(boot, dtype=torch.float32).flatten(0, 1)
        actions = torch.as_tensor(batch["actions"]).flatten().long()
        with torch.no_grad():
            if a.double:  # the online net picks the action, the target net values it
                index = torch.as_tensor(index).flatten()
                picks = q_all.detach()[torch.arange(B).repeat_interleave(T), index.clamp(min=0)]
                final = ((index < 0) & torch.as_tensor(discounts > 0).flatten()).nonzero().squeeze(1)
                if final.numel():  # truncated: bootstrap from the final observation
                    picks[final] = self.q(boot[final])
                value = self.target(boot).gather(1, picks.argmax(1, keepdim=True)).squeeze(1)
            else:
                value = self.target(boot).max(1).values
            target = torch.as_tensor(returns).flatten() + torch.as_tensor(discounts).flatten() * value
        q = q_all[:, :T].flatten(0, 1).gather(1, actions[:, None]).squeeze(1)
        per_session = F.smooth_l1_loss(q, target, reduction="none").view(B, T).mean(1)
        weights = torch.as_tensor(batch["is_weight"]) if "is_weight" in batch else torch.ones(B)
        loss = (weights * per_session).mean()
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), a.max_grad_norm)
        self.optimizer.step()
        n = max(1, round(B / a.batch_sessions))  # a batch of n x batch_sessions counts n: schedules hold per sample
        self.updates, self.since_target = self.updates + n, self.since_target + n
        if self.since_target >= a.target_every:
            self.target.load_state_dict(self.q.state_dict())
            self.since_target = 0
        if self.per is not None and "id" in batch:
            td = (target - q).detach().abs().view(B, T).numpy()
            self.per.update(batch["id"], a.per_eta * td.max(1) + (1 - a.per_eta) * td.mean(1) + a.per_eps)
        return {"loss": loss.item(), "q": q.mean().item(), "beta": self.beta() if a.per else 0.0}

    # -- params -----------------------------------------------------------------
    def get_params(self):
        params = {f"q.{k}": v.numpy().copy() for k, v in self.q.state_dict().items()}
        params |= {f"target.{k}": v.numpy().copy() for k, v in self.target.state_dict().items()}
        return params | {"updates": np.array(self.updates, np.int64)}

    def set_params(self, params):
        for name, net in (("q", self.q), ("target", self.target)):
            net.load_state_dict({k: torch.from_numpy(params[f"{name}.{k}"]) for k in net.state_dict()})
        self.updates = int(params["updates"])


def make_experiment(db, args: Args):
    return DQN(db, args)
