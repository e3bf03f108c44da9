"""DQN with the improvements that matter, for vector observations and discrete actions (CleanRL style).

    pip install -e '.[examples]'                         # LunarLander: '.[examples,box2d]'
    python -m tinyverse examples/dqn.py play --set env_id=LunarLander-v3 &
    python -m tinyverse examples/dqn.py train &          # adopts the options the first worker stored
    python -m tinyverse examples/dqn.py eval -n 10 --no-record
    python -m tinyverse examples/dqn.py train --set env_id=Acrobot-v1 --set per=0 --prefix acrobot-no-per

``env_id`` picks a preset (``PRESETS``: RL-Zoo's SB3 DQN hyperparameters for CartPole-v1, the default,
Acrobot-v1 and LunarLander-v3) of the options left unset; each improvement has a switch, so that
``bench/dqn.py --ablate`` can measure it: double Q-learning (``double``,
https://arxiv.org/abs/1509.06461), dueling heads (``dueling``, https://arxiv.org/abs/1511.06581),
n-step returns (``n_step``), prioritized replay kept by the trainer, not the database (``per``,
https://arxiv.org/abs/1511.05952, with R2D2's priorities of sequences,
https://openreview.net/forum?id=r1lyTjAqYX), and Ape-X's spread of the players' epsilons
(https://arxiv.org/abs/1803.00933). Each live player adds ``train_batch_size`` to the trainer's batch
(``batch_per_player``), counted so by the pace and the schedules. Design and measured results:
docs/examples.rst.
"""

import threading
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from common import get_weights, load_weights

import tinyverse
from tinyverse import explore, nstep_transitions


@dataclass
class Args(tinyverse.Settings):
    TUNABLE = ("learning_rate", "max_grad_norm", "target_every", "eps_start", "exploration_steps", "per_beta")  # tune
    # the core's settings (tinyverse.Settings) this file sets otherwise; None: the env_id's preset
    session_length: int = 16
    """ticks per recorded session"""
    train_batch_size: int | None = None
    """sessions per minibatch (default of train -b); each brings session_length transitions"""
    buffer_size: int | None = None
    """sessions the database keeps (None: buffer_transitions // session_length)"""
    batch_per_player: bool = True
    """train_batch_size per live player: more players, larger updates (counted so by every schedule)"""
    local_params: tuple[str, ...] = ("target.*",)
    """with several trainers each keeps its own target net"""
    updates_per_step: float | None = None
    """the replay ratio: trainer updates per env step (SB3: gradient_steps / train_freq)"""
    learning_starts: int | None = None
    """env steps played before the first update (players run ahead by this much)"""
    # its own
    env_id: str = "CartPole-v1"
    """the Gymnasium environment; it picks the preset of the options left unset (None)"""
    hidden: int = 256
    """units in each hidden layer"""
    learning_rate: float | None = None
    """Adam step size"""
    gamma: float = 0.99
    """discount factor"""
    buffer_transitions: int | None = None
    """transitions kept in the database (the buffer_size of the preset, in sessions)"""
    target_every: int | None = None
    """updates between copies of the online net into the target net"""
    max_grad_norm: float = 10.0
    """gradient clipping (global L2 norm)"""
    eps_start: float = 1.0
    """exploration epsilon before any update"""
    eps_end: float | None = None
    """final epsilon of a lone player"""
    exploration_steps: int | None = None
    """env steps over which epsilon decays (counted as updates / updates_per_step)"""
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
        for key, value in PRESETS.get(self.env_id, PRESETS["CartPole-v1"]).items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        if self.buffer_size is None:
            self.buffer_size = max(1, self.buffer_transitions // self.session_length)


# RL-Zoo's SB3 DQN hyperparameters (hyperparams/dqn.yml) in this file's terms; CartPole-v1's serve any other env_id
PRESETS = {
    "CartPole-v1": dict(
        learning_rate=2.3e-3,
        train_batch_size=4,
        buffer_transitions=100_000,
        updates_per_step=0.5,
        learning_starts=1000,
        target_every=128,
        eps_end=0.04,
        exploration_steps=8000,
        per_beta_updates=20_000,
    ),
    "Acrobot-v1": dict(
        learning_rate=6.3e-4,
        train_batch_size=8,
        buffer_transitions=50_000,
        updates_per_step=1.0,
        learning_starts=0,
        target_every=250,
        eps_end=0.1,
        exploration_steps=12_000,
        per_beta_updates=100_000,
    ),
}
PRESETS["LunarLander-v3"] = PRESETS["Acrobot-v1"]


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
        """Set leaves, then re-add their ancestors level by level (log N levels; a shared one twice, alike)."""
        idx = np.asarray(leaves, np.int64) + self.size
        self.tree[idx] = priorities
        while len(idx) and idx[0] > 1:
            idx = idx // 2
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
    """The trainer's priorities over the database's ring of session ids: a sum tree, leaf = id % capacity.

    ``sync`` follows ``db.session_range()``: new ids enter at the maximum priority, evicted ones drop to 0;
    ``draw`` picks ids in proportion to priority (stratified); ``update`` sets them from TD errors.
    """

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
    def __init__(self, args: Args | None = None):
        self.args = a = args or Args()
        super().__init__(a)  # the core reads its settings (the pace, the batch, the buffer) there
        assert a.n_step >= 1, "n_step must be at least 1"
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
        self.final_epsilon = explore.apex_epsilon(a.eps_end, a.apex_alpha, *explore.player_slot(a.apex_players))

    def make_env(self, render_mode=None):
        return gym.make(self.args.env_id, render_mode=render_mode)

    # -- players ----------------------------------------------------------------
    def epsilon(self) -> float:
        # Decays with trainer updates, not this player's steps: a fast player (or ten) would
        # otherwise reach its final epsilon before the net knows anything.
        a = self.args
        fraction = self.updates / max(a.exploration_steps * a.updates_per_step, 1)
        return explore.linear(a.eps_start, self.final_epsilon, fraction)

    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        q = self.q(torch.as_tensor(observations, dtype=torch.float32)).numpy()
        return explore.epsilon_greedy(q, 0.0 if greedy else self.epsilon(), self.rng), memory

    def session_info(self):
        # called once per recorded round, before it is stored and before params are synced:
        # the epsilon this round played with
        return {"epsilon": self.epsilon()}

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        # fused: one kernel for all tensors, 3.2 -> 2.2 ms an update of the dueling net on one CPU thread
        self.optimizer = torch.optim.Adam(self.q.parameters(), lr=self.args.learning_rate, fused=True)

    def beta(self) -> float:
        return explore.linear(self.args.per_beta, 1.0, self.updates / max(self.args.per_beta_updates, 1))

    def sample(self, db, batch_size):
        if not self.args.per:
            return db.sample_batch(batch_size)
        lo, hi = db.session_range()
        if self.per is None:
            capacity = db.capacity() or self.args.buffer_size
            self.per = PrioritizedReplay(max(capacity, hi - lo + 1, 1), self.args.per_alpha)
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

    def bootstrap_value(self, t, q_all: torch.Tensor) -> torch.Tensor:
        """max_a Q(s', a) of every transition's bootstrap observation s' (B x T,), double Q: the online net's
        pick, read from its forward ``q_all`` over the session where s' is in it, valued by the target net."""
        boot = torch.as_tensor(t.next_observations, dtype=torch.float32).flatten(0, 1)
        if not self.args.double:
            return self.target(boot).max(1).values
        B, T = t.returns.shape
        index = torch.as_tensor(t.next_index).flatten()
        picks = q_all[torch.arange(B).repeat_interleave(T), index.clamp(min=0)]
        final = ((index < 0) & torch.as_tensor(t.discounts > 0).flatten()).nonzero().squeeze(1)
        if final.numel():  # truncated: bootstrap from the final observation
            picks[final] = self.q(boot[final])
        return self.target(boot).gather(1, picks.argmax(1, keepdim=True)).squeeze(1)

    def train_step(self, batch):
        a = self.args
        B, T = batch["rewards"].shape
        t = nstep_transitions(batch, a.n_step, a.gamma)
        # double Q: one forward of the online net over all T+1 observations gives both the
        # trained Q(s_t, a_t) and its pick at the bootstrap observations, which are s_{t+m}
        # except after a truncation (a final observation: forwarded apart, rarely)
        obs = torch.as_tensor(batch["observations"][:, : T + 1 if a.double else T], dtype=torch.float32)
        q_all = self.q(obs.flatten(0, 1)).view(B, obs.shape[1], -1)
        with torch.no_grad():
            value = self.bootstrap_value(t, q_all.detach())
            target = torch.as_tensor(t.returns).flatten() + torch.as_tensor(t.discounts).flatten() * value
        actions = torch.as_tensor(t.actions).flatten().long()
        q = q_all[:, :T].flatten(0, 1).gather(1, actions[:, None]).squeeze(1)
        per_session = F.smooth_l1_loss(q, target, reduction="none").view(B, T).mean(1)
        weights = torch.as_tensor(batch["is_weight"]) if "is_weight" in batch else torch.ones(B)
        loss = (weights * per_session).mean()
        for group in self.optimizer.param_groups:  # tunable: a tune --set reaches the next step
            group["lr"] = a.learning_rate
        self.optimizer.zero_grad()
        loss.backward()
        nn.utils.clip_grad_norm_(self.q.parameters(), a.max_grad_norm)
        self.optimizer.step()
        n = max(1, round(B / a.train_batch_size))  # a batch of n x train_batch_size counts n: schedules hold per sample
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
        return get_weights({"q": self.q, "target": self.target}) | {"updates": np.array(self.updates, np.int64)}

    def set_params(self, params):
        load_weights({"q": self.q, "target": self.target}, params)
        self.updates = int(params["updates"])


def make_experiment(args: Args):
    return DQN(args)
