"""What several PyTorch examples share: one torch thread, weights as params, the trainer's device, V-trace and
APPO's loss (atari.py, recurrent.py), and the pieces of the continuous-action learners (ddpg_td3.py, sac.py,
naf.py): actions in [-1, 1], a critic, soft updates and exploration noises.

    from common import get_weights, load_weights, pick_device, ...

Importing it sets torch to one thread: torch's default thread count made a DQN
run 4x slower with several processes on 2 cores.
"""

import math
import os

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal init as in OpenAI baselines / CleanRL."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


def get_weights(nets: dict[str, nn.Module]) -> dict[str, np.ndarray]:
    """Every network's state as params named ``<name>.<key>`` (a network named "" keeps its own keys):
    NumPy copies, on the CPU."""
    return {
        f"{name}.{k}" if name else k: v.detach().cpu().numpy().copy()
        for name, net in nets.items()
        for k, v in net.state_dict().items()
    }


def load_weights(nets: dict[str, nn.Module], params: dict[str, np.ndarray]) -> None:
    """The inverse of :func:`get_weights`: load each network's state from the params."""
    for name, net in nets.items():
        net.load_state_dict({k: torch.from_numpy(params[f"{name}.{k}" if name else k]) for k in net.state_dict()})


def pick_device() -> torch.device:
    """The trainer's device: $TINYVERSE_DEVICE (``--device``), auto = CUDA when there is one (per process, not an
    option)."""
    device = os.environ.get("TINYVERSE_DEVICE", "auto")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert not device.startswith("cuda") or torch.cuda.is_available(), f"device {device} but no CUDA device"
    return torch.device(device)


# -- APPO: V-trace and PPO's clipped surrogate (atari.py, recurrent.py) --------------------------------------------
@torch.no_grad()
def vtrace(behaviour_logp, target_logp, rewards, values, next_values, ended, gamma, rho_bar=1.0, c_bar=1.0, lam=1.0):
    """V-trace value targets ``vs`` and the Q estimates ``qs`` the policy gradient uses, for (B, T) sessions
    (Espeholt et al. 2018, https://arxiv.org/abs/1802.01561, eq. 1).

    ``values[:, t]`` is V(x_t); ``next_values[:, t]`` the value of what followed tick t: V(x_t+1), the
    episode's final observation's where it was truncated, 0 where it terminated. ``ended`` cuts the recursion
    where an episode ended; after the last tick the target bootstraps from ``next_values``. ``qs[:, t]`` =
    r_t + gamma v_t+1. With equal log-probabilities (no lag) ``vs`` are the n-step returns to the session's
    (or the episode's) end, or with ``lam`` < 1 the lambda-returns (GAE's targets).
    """
    ratios = (target_logp - behaviour_logp).exp()
    rho, c = ratios.clamp(max=rho_bar), lam * ratios.clamp(max=c_bar)
    deltas = rho * (rewards + gamma * next_values - values)
    carry = gamma * c * (~ended)  # how much of the next tick's correction flows back to this one
    corrections = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[:, 0])
    for t in reversed(range(deltas.shape[1])):  # T small steps over the whole batch at once
        running = deltas[:, t] + carry[:, t] * running
        corrections[:, t] = running
    vs = values + corrections
    # v_s+1 for the advantage: the next tick's target within an episode, what followed it at its end
    next_vs = torch.cat([torch.where(ended[:, :-1], next_values[:, :-1], vs[:, 1:]), next_values[:, -1:]], 1)
    return vs, rewards + gamma * next_vs


def appo_loss(logp_all, logp, recorded, values, next_values, rewards, ended, a, skip: int = 0):
    """The loss of one update on (B, T) ticks, its metrics, and the ratios of the trainer's policy to the players'.

    PPO's clipped surrogate (https://arxiv.org/abs/1707.06347) on V-trace's advantages, the ratio taken to the
    players' recorded policy (RLlib's APPO); with ``a.clip`` 0, IMPALA's policy gradient; with ``a.vtrace``
    off as well, plain A2C. ``logp_all`` (B, T, A) and ``logp`` (B, T): the trainer's log-probabilities of
    every action and of the taken one; ``recorded`` (B, T): the players'; ``values`` (B, T+1) and
    ``next_values`` (B, T) as :func:`vtrace` takes them; ``skip``: leading ticks left out (a burn-in).
    """
    T = logp.shape[1]
    vs, advantages, ratios, metrics = appo_targets(logp, recorded, values, next_values, rewards, ended, a)
    kept = (x[:, skip:] for x in (logp_all, logp, recorded, values[:, :T], vs, advantages))
    total, more = appo_surrogate(*kept, a)
    return total, metrics | more, ratios


@torch.no_grad()
def appo_targets(logp, recorded, values, next_values, rewards, ended, a):
    """V-trace's value targets ``vs`` and advantages for (B, T) ticks, the ratios of the trainer's policy to
    the players', and the ratios' metrics."""
    T = logp.shape[1]
    target = logp.detach()
    ratios = (target - recorded).exp()  # what V-trace weighs ticks by (measured when it is off too)
    behaviour = recorded if a.vtrace else target  # off: as if the data were on-policy (plain A2C)
    values = values[:, :T].detach()
    vs, qs = vtrace(behaviour, target, rewards, values, next_values, ended, a.gamma, a.rho_bar, a.c_bar, a.lam)
    metrics = {"rho_mean": ratios.mean().item(), "rho_clipped": (ratios > a.rho_bar).float().mean().item()}
    return vs, qs - values, ratios, metrics


def appo_surrogate(logp_all, logp, recorded, values, vs, advantages, a):
    """The loss on ticks of any shape given their value targets and advantages, and its metrics."""
    if a.normalize_advantages:  # over these ticks (PPO: over each minibatch)
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    more = {}
    if a.clip:  # PPO's clipped surrogate on the ratio to the behaviour policy (APPO)
        ratio = (logp - recorded).exp()
        pg_loss = -torch.min(ratio * advantages, ratio.clamp(1 - a.clip, 1 + a.clip) * advantages).mean()
        more["clip_fraction"] = ((ratio - 1).abs() > a.clip).float().mean().item()  # as SB3 reports it
    else:  # IMPALA: the clipped importance weight times the advantage
        behaviour = recorded if a.vtrace else logp.detach()
        rho = (logp.detach() - behaviour).exp().clamp(max=a.rho_bar)
        pg_loss = -(logp * rho * advantages).mean()
    value_loss = 0.5 * ((vs - values) ** 2).mean()
    entropy = -(logp_all.exp() * logp_all).sum(-1).mean()
    total = pg_loss + a.vf_coef * value_loss - a.ent_coef * entropy
    metrics = {"loss": total.item(), "pg_loss": pg_loss.item(), "value_loss": value_loss.item()}
    return total, metrics | more | {"entropy": entropy.item(), "value": values.mean().item()}


def sample_recent(db, batch_size: int, recent: int) -> dict:
    """``batch_size`` sessions drawn among the newest ``recent`` (none: "not yet"), with each one's
    ``policy_lag``: how many params versions behind the stored ones the params that played it were."""
    lo, hi = db.session_range()
    lo = max(lo, hi - max(recent, batch_size) + 1)
    if hi - lo + 1 < batch_size:
        return {}
    ids = np.random.default_rng().choice(np.arange(lo, hi + 1), batch_size, replace=False)
    batch = db.get_batch(ids.tolist())
    if batch:
        batch["policy_lag"] = (db.params_version() or 0) - batch["version"]
    return batch


def derive_pace(a, slack: int | None = None) -> None:
    """The batch and the pace the options ``a`` leave unset (None), from their own knobs: an update trains on
    ``batch_ticks`` ticks, each recorded tick is trained on ``max_reuse`` times on average, and players never
    run further ahead than ``slack`` ticks (default: half of what is sampled, ``recent_sessions``)."""
    if a.train_batch_size is None:
        a.train_batch_size = max(1, round(a.batch_ticks / a.session_length))
    if a.updates_per_step is None:
        a.updates_per_step = a.max_reuse / (a.train_batch_size * a.session_length)
    if a.pace_slack is None:
        a.pace_slack = a.recent_sessions * a.session_length // 2 if slack is None else slack


def prepare_appo(exp, learning_rate: float) -> None:
    """The trainer's device and optimizer: Adam rather than A2C's RMSprop, whose averages start at 0 in
    PyTorch and make the first steps 10x too large; fused: one kernel for all params."""
    exp.device = pick_device()
    exp.net.to(exp.device)
    exp.optimizer = torch.optim.Adam(exp.net.parameters(), lr=learning_rate, eps=1e-5, fused=True)


# -- continuous actions (ddpg_td3.py, sac.py, naf.py) ---------------------------------------------------------------
class BoxActions:
    """A bounded Box action space of one dimension, seen from networks that act in [-1, 1]."""

    def __init__(self, space: gym.Space):
        assert isinstance(space, gym.spaces.Box) and len(space.shape) == 1, "only Box actions of one dimension"
        assert np.isfinite(space.low).all() and np.isfinite(space.high).all(), "only bounded actions"
        self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)
        self.n = space.shape[0]

    def to_env(self, u: np.ndarray) -> np.ndarray:
        """[-1, 1] -> [low, high], float32."""
        a = self.low + (np.asarray(u, np.float32) + 1) * 0.5 * (self.high - self.low)
        return np.clip(a, self.low, self.high).astype(np.float32)

    def from_env(self, actions: np.ndarray) -> np.ndarray:
        """[low, high] -> [-1, 1], float32."""
        return (2 * (np.asarray(actions, np.float32) - self.low) / (self.high - self.low) - 1).astype(np.float32)


def mlp(sizes: list[int], relu_last: bool = False) -> nn.Sequential:
    """Linear layers of the given sizes with ReLU between them (and after the last one if asked)."""
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if relu_last or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Critic(nn.Module):
    """Q(s, a) for actions in [-1, 1]^act_dim, shape (N,)."""

    def __init__(self, n_obs: int, n_act: int, hidden: list[int]):
        super().__init__()
        self.net = mlp([n_obs + n_act, *hidden, 1])

    def forward(self, obs, act):
        return self.net(torch.cat([obs, act], 1))[:, 0]


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    """target <- (1 - tau) target + tau online."""
    with torch.no_grad():
        for t, o in zip(target.parameters(), online.parameters(), strict=True):
            t.lerp_(o, tau)


class ActionNoise:
    """The exploration of a deterministic policy mu(s) in [-1, 1] at scale ``scale``, per ``kind``:
    gaussian: mu + N(0, s^2); ou: mu + an Ornstein-Uhlenbeck process, kept per environment in the player's
    memory; param: a perturbed copy of the policy per environment, redrawn at its episode's start
    (https://arxiv.org/abs/1706.01905); none: mu."""

    KINDS = ("gaussian", "ou", "param", "none")

    def __init__(self, kind: str, scale: float, ou_theta: float, ou_dt: float, param_std: float, adapt: float):
        self.kind = kind
        self.scale = scale
        self.ou_theta, self.ou_dt = ou_theta, ou_dt
        self.adapt = adapt
        self.sigma = param_std  # param: the weights' perturbation, adapted every tick towards ``scale``
        self.eps: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # param: per env and layer
        self.rng = np.random.default_rng()

    def initial_memory(self, batch_size: int, n_act: int) -> dict[str, np.ndarray]:
        if self.kind == "ou":
            return {"ou": np.zeros((batch_size, n_act), np.float32)}
        if self.kind == "param":
            return {"fresh": np.ones(batch_size, np.float32)}  # draw a perturbation at the episode's start
        return {}

    def __call__(self, obs, mu: np.ndarray, layers: list[nn.Linear], memory: dict) -> tuple[np.ndarray, dict]:
        """Actions in [-1, 1] (before clipping) around ``mu``, and the new memory. ``layers``: the policy's
        Linear layers from observation to mu, ReLU between them and tanh after (for param noise)."""
        s = self.scale
        if self.kind == "gaussian":
            return mu + s * self.rng.standard_normal(mu.shape), memory
        if self.kind == "ou":
            drift = memory["ou"] * (1 - self.ou_theta * self.ou_dt)
            x = drift + s * math.sqrt(self.ou_dt) * self.rng.standard_normal(mu.shape)
            return mu + x, {**memory, "ou": x.astype(np.float32)}
        if self.kind == "param":
            perturbed = self.perturbed(obs, layers, memory["fresh"]).cpu().numpy()
            distance = float(np.sqrt(np.mean((perturbed - mu) ** 2)))
            self.sigma *= self.adapt if distance < s else 1 / self.adapt
            return perturbed, {**memory, "fresh": np.zeros_like(memory["fresh"])}
        return mu, memory

    def perturbed(self, obs: torch.Tensor, layers: list[nn.Linear], fresh: np.ndarray) -> torch.Tensor:
        """mu(s) of each environment's perturbed policy, theta + sigma eps; eps drawn anew where ``fresh``."""
        B = len(obs)
        if self.eps is None or len(self.eps[0][0]) != B:
            self.eps = [(obs.new_empty(B, *m.weight.shape), obs.new_empty(B, *m.bias.shape)) for m in layers]
            fresh = np.ones(B)
        new = torch.as_tensor(np.flatnonzero(fresh), device=obs.device)
        for w, b in self.eps:
            w[new], b[new] = torch.randn_like(w[new]), torch.randn_like(b[new])
        h = obs
        for i, (m, (w, b)) in enumerate(zip(layers, self.eps, strict=True)):
            h = F.linear(h, m.weight, m.bias) + self.sigma * ((w @ h[:, :, None])[:, :, 0] + b)
            h = torch.relu(h) if i < len(layers) - 1 else torch.tanh(h)
        return h

    def info(self) -> dict[str, float]:
        """What each session stores of it: the scale, and param noise's sigma."""
        return {"noise": self.scale} | ({"param_sigma": self.sigma} if self.kind == "param" else {})
