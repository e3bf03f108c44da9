"""DDPG, TD3, SAC and NAF for vector observations and continuous (Box) actions, CleanRL style.

    pip install -e '.[examples]'                          # LunarLander, BipedalWalker: '.[examples,box2d]'
    python -m tinyverse examples/continuous.py run -n 20000                  # TD3 on Pendulum-v1, RL-Zoo's preset
    python -m tinyverse examples/continuous.py run -n 20000 --set algo=sac --prefix pendulum-sac
    python -m tinyverse examples/continuous.py run --players 4 --set algo=ddpg --set noise=ou --prefix pendulum-ou
    python -m tinyverse examples/continuous.py eval -n 3                     # greedy episodes, mp4s in ./records
    python -m tinyverse examples/continuous.py run --set env_id=BipedalWalker-v3 --set algo=sac --prefix walker

One family of off-policy actor-critics on uniform replay: ``Continuous`` holds what they share (actions
in [-1, 1], exploration, n-step targets, params) and each algorithm builds its networks and updates them.
``algo`` and ``env_id`` pick the preset (``PRESETS``: RL-Zoo's SB3 hyperparameters) of the options left
unset. Exploration (``noise``): gaussian, Ornstein-Uhlenbeck, parameter-space, or none (SAC samples its
policy), at a scale spread over the players as in Ape-X. Design and measured results: docs/examples.rst.

DDPG: https://arxiv.org/abs/1509.02971 (DPG: http://proceedings.mlr.press/v32/silver14.html).
TD3: https://arxiv.org/abs/1802.09477. SAC: https://arxiv.org/abs/1801.01290, https://arxiv.org/abs/1812.05905.
NAF: https://arxiv.org/abs/1603.00748. Parameter noise: https://arxiv.org/abs/1706.01905.
Ape-X: https://arxiv.org/abs/1803.00933.
"""

import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from common import get_weights, load_weights, pick_device, player_slot

import tinyverse
from tinyverse import nstep_transitions

NOISES = ("gaussian", "ou", "param", "none")
LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # SAC's log-std clamp (SB3's)


@dataclass
class Args:
    env_id: str = "Pendulum-v1"
    """the Gymnasium environment (a Box action space); with algo it picks the preset of the options left unset"""
    algo: str = "td3"
    """ddpg, td3, sac or naf"""
    noise: str = ""
    """exploration: gaussian, ou, param or none (default "": none for sac, gaussian for the others)"""
    noise_std: float | None = None
    """scale s of the exploration noise in [-1, 1] units (param noise: its target action distance)"""
    noise_spread: float = 2.0
    """Ape-X: player i of n explores with noise_std * noise_spread ** (1 - 2 i / (n - 1))"""
    noise_players: int = 1
    """Ape-X: n assumed when TINYVERSE_WORKER_COUNT is unset (i is then drawn at random)"""
    ou_theta: float = 0.15
    """Ornstein-Uhlenbeck: pull towards 0"""
    ou_dt: float = 0.01
    """Ornstein-Uhlenbeck: time step"""
    param_init_std: float = 0.1
    """parameter noise: initial sigma of the weight perturbation"""
    param_adapt: float = 1.01
    """parameter noise: sigma's factor per tick towards the target action distance"""
    random_warmup: bool = True
    """act uniformly at random until trained params (updates > 0) reach the player"""
    net_arch: str | None = None
    """hidden layer sizes, comma-separated, e.g. 400,300"""
    learning_rate: float | None = None
    """Adam step size of every network (and of SAC's temperature)"""
    gamma: float | None = None
    """discount factor"""
    tau: float | None = None
    """soft target update: target <- (1 - tau) target + tau online, each update (TD3: each actor update)"""
    n_step: int = 1
    """n of n-step returns (1: one-step TD)"""
    session_length: int = 4
    """ticks per recorded session (short: a batch's transitions correlate less)"""
    batch_sessions: int = 64
    """sessions per minibatch; each brings session_length transitions"""
    buffer_transitions: int | None = None
    """transitions kept in the database (buffer_transitions // session_length sessions)"""
    replay_ratio: float = 1.0
    """trainer updates per env step"""
    learning_starts: int | None = None
    """env steps played before the first update"""
    pace_slack: int = 1000
    """env steps either side may run ahead of the replay ratio"""
    policy_delay: int = 2
    """TD3: critic updates per actor and target update"""
    target_noise: float = 0.2
    """TD3: std of the target policy smoothing noise"""
    target_noise_clip: float = 0.5
    """TD3: the smoothing noise is clipped to +- this"""
    autotune: bool = True
    """SAC: tune alpha towards the target entropy -act_dim (else alpha stays fixed)"""
    alpha: float = 1.0
    """SAC: the entropy coefficient, initial when autotuned (SB3's 1.0)"""
    seed: int = -1
    """seed of the networks' initial weights (-1: random)"""

    def __post_init__(self):
        """Fill the options left unset from the preset of (algo, env_id): the stored options are complete."""
        if self.algo not in DEFAULTS:
            raise tinyverse.TinyverseError(f"algo={self.algo}: choose one of {', '.join(DEFAULTS)}")
        for key, value in {**DEFAULTS[self.algo], **PRESETS.get((self.algo, self.env_id), {})}.items():
            if getattr(self, key) in (None, ""):
                setattr(self, key, value)
        if self.noise not in NOISES:
            raise tinyverse.TinyverseError(f"noise={self.noise}: choose one of {', '.join(NOISES)}")
        if self.algo == "sac" and self.noise != "none":
            raise tinyverse.TinyverseError(
                f"noise={self.noise}: sac explores by sampling its own policy, use noise=none"
            )


# SB3's defaults (DDPG and TD3 alike; SAC's learning rate is 3e-4), used for any env_id without a preset,
# and each algorithm's exploration
_SB3 = dict(
    net_arch="256,256",
    learning_rate=1e-3,
    gamma=0.99,
    tau=0.005,
    buffer_transitions=1_000_000,
    learning_starts=100,
    noise_std=0.1,
    noise="gaussian",
)
DEFAULTS = {"ddpg": _SB3, "td3": _SB3, "sac": {**_SB3, "learning_rate": 3e-4, "noise": "none"}, "naf": _SB3}
# RL-Zoo (hyperparams/td3.yml; ddpg.yml has the same entries for these three envs)
_ZOO_TD3 = dict(
    net_arch="400,300",
    learning_rate=1e-3,
    gamma=0.98,
    buffer_transitions=200_000,
    learning_starts=10_000,
    noise_std=0.1,
)
_BOX2D = ("LunarLanderContinuous-v3", "BipedalWalker-v3")
PRESETS = {(algo, env): _ZOO_TD3 for algo in ("ddpg", "td3") for env in ("Pendulum-v1", *_BOX2D)}
PRESETS |= {  # RL-Zoo's hyperparams/sac.yml
    ("sac", "Pendulum-v1"): dict(learning_rate=1e-3),
    ("sac", "LunarLanderContinuous-v3"): dict(
        net_arch="400,300", learning_rate=7.3e-4, tau=0.01, learning_starts=10_000
    ),
    ("sac", "BipedalWalker-v3"): dict(
        net_arch="400,300",
        learning_rate=7.3e-4,
        buffer_transitions=300_000,
        gamma=0.98,
        tau=0.02,
        learning_starts=10_000,
    ),
}
PRESETS |= {("naf", env): dict(learning_starts=10_000) for env in _BOX2D}


def player_noise_scale(args: Args, index: int, count: int) -> float:
    """The exploration scale of player ``index`` of ``count`` (Ape-X style); a lone player uses noise_std."""
    if count <= 1:
        return args.noise_std
    return args.noise_std * args.noise_spread ** (1 - 2 * index / (count - 1))


def mlp(sizes: list[int], relu_last: bool = False) -> nn.Sequential:
    """Linear layers of the given sizes with ReLU between them (and after the last one if asked)."""
    layers = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if relu_last or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class Actor(nn.Module):
    """Deterministic policy mu(s) in [-1, 1]^act_dim."""

    def __init__(self, n_obs: int, n_act: int, hidden: list[int]):
        super().__init__()
        self.net = mlp([n_obs, *hidden, n_act])

    def forward(self, obs):
        return torch.tanh(self.net(obs))

    def policy_layers(self) -> list[nn.Linear]:
        """The Linear layers from observation to mu, ReLU between them, tanh after (for parameter noise)."""
        return [m for m in self.net if isinstance(m, nn.Linear)]


class Critic(nn.Module):
    """Q(s, a) for actions in [-1, 1]^act_dim, shape (N,)."""

    def __init__(self, n_obs: int, n_act: int, hidden: list[int]):
        super().__init__()
        self.net = mlp([n_obs + n_act, *hidden, 1])

    def forward(self, obs, act):
        return self.net(torch.cat([obs, act], 1))[:, 0]


def squashed_log_prob(u, mean, log_std):
    """log pi(tanh(u)) of u ~ N(mean, exp(log_std)^2), summed over the action's dimensions.

    The density of a = tanh(u) is that of u divided by |da/du| = 1 - tanh(u)^2, whose log is written
    2 (log 2 - u - softplus(-2u)) to stay finite where tanh(u) rounds to +-1.
    """
    z = (u - mean) / log_std.exp()
    gaussian = -0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)
    return (gaussian - 2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)


class GaussianActor(nn.Module):
    """SAC's policy: a = tanh(u), u ~ N(mean(s), std(s)^2)."""

    def __init__(self, n_obs: int, n_act: int, hidden: list[int]):
        super().__init__()
        self.trunk = mlp([n_obs, *hidden], relu_last=True)
        self.mean, self.log_std = nn.Linear(hidden[-1], n_act), nn.Linear(hidden[-1], n_act)

    def forward(self, obs):
        h = self.trunk(obs)
        return self.mean(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    def sample(self, obs):
        """Actions (N, act_dim) drawn with the reparameterization trick, and their log-probabilities (N,)."""
        mean, log_std = self(obs)
        u = mean + log_std.exp() * torch.randn_like(mean)
        return torch.tanh(u), squashed_log_prob(u, mean, log_std)


class NAFNet(nn.Module):
    """V(s), mu(s) and L(s) on a shared trunk; Q(s, a) = V - 1/2 |L^T (a - mu)|^2 = V - 1/2 (a-mu)^T L L^T (a-mu)."""

    def __init__(self, n_obs: int, n_act: int, hidden: list[int]):
        super().__init__()
        self.trunk = mlp([n_obs, *hidden], relu_last=True)
        self.value, self.mu = nn.Linear(hidden[-1], 1), nn.Linear(hidden[-1], n_act)
        self.entries = nn.Linear(hidden[-1], n_act * (n_act + 1) // 2)
        self.register_buffer("rows", torch.tril_indices(n_act, n_act)[0], persistent=False)
        self.register_buffer("cols", torch.tril_indices(n_act, n_act)[1], persistent=False)
        self.n_act = n_act

    def forward(self, obs):
        """V (N,), mu (N, act_dim) and L (N, act_dim, act_dim), lower-triangular with a positive diagonal."""
        h = self.trunk(obs)
        L = h.new_zeros(len(obs), self.n_act, self.n_act)
        L[:, self.rows, self.cols] = self.entries(h)
        L = L.tril(-1) + torch.diag_embed(L.diagonal(dim1=1, dim2=2).exp())
        return self.value(h)[:, 0], torch.tanh(self.mu(h)), L

    def q(self, obs, act):
        v, mu, L = self(obs)
        y = (L * (act - mu)[:, :, None]).sum(1)  # L^T (a - mu): y_j = sum_i L_ij (a - mu)_i
        return v - 0.5 * (y**2).sum(1)

    def policy_layers(self) -> list[nn.Linear]:
        return [*(m for m in self.trunk if isinstance(m, nn.Linear)), self.mu]


def soft_update(target: nn.Module, online: nn.Module, tau: float) -> None:
    with torch.no_grad():
        for t, o in zip(target.parameters(), online.parameters(), strict=True):
            t.lerp_(o, tau)


class Continuous(tinyverse.Experiment):
    """What the four algorithms share: actions, exploration, targets, params. Subclasses build and update."""

    local_params = ("target.*",)  # with several trainers each keeps its own target networks

    def __init__(self, db=None, args: Args | None = None):
        super().__init__(db)
        self.args = a = args or Args()
        assert a.n_step >= 1 and a.policy_delay >= 1, "n_step and policy_delay must be at least 1"
        # the pace the core's loops hold: replay_ratio updates an env step, after learning_starts, within pace_slack
        self.updates_per_step, self.learning_starts, self.pace_slack = a.replay_ratio, a.learning_starts, a.pace_slack
        self.session_length = a.session_length
        self.buffer_size = max(1, a.buffer_transitions // a.session_length)
        self.train_batch_size = a.batch_sessions
        env = self.make_env()
        space = env.action_space
        assert isinstance(space, gym.spaces.Box) and len(space.shape) == 1, "only Box actions of one dimension"
        assert np.isfinite(space.low).all() and np.isfinite(space.high).all(), "only bounded actions"
        assert len(env.observation_space.shape) == 1, "only vector observations"
        self.n_obs, self.n_act = env.observation_space.shape[0], space.shape[0]
        self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)
        env.close()
        if a.seed >= 0:
            torch.manual_seed(a.seed)
        self.hidden = [int(h) for h in a.net_arch.split(",")]
        self.device = torch.device("cpu")  # trainers move to $TINYVERSE_DEVICE in prepare_training
        self.build()
        self.updates = 0  # all trainers' updates (params merge it); players act at random while it is 0
        self.rng = np.random.default_rng()
        self.noise_scale = 0.0 if a.noise == "none" else player_noise_scale(a, *player_slot(a.noise_players))
        self.param_sigma = a.param_init_std
        self.param_eps: list[tuple[torch.Tensor, torch.Tensor]] | None = None  # per env and policy layer

    def build(self) -> None:
        """Create the networks (``self.nets()``) and their targets."""
        raise NotImplementedError

    def nets(self) -> dict[str, nn.Module]:
        """Every network by its params name, targets as ``target.<name>``."""
        raise NotImplementedError

    def make_env(self, render_mode=None):
        return gym.make(self.args.env_id, render_mode=render_mode)

    # -- actions ----------------------------------------------------------------
    def to_env(self, u: np.ndarray) -> np.ndarray:
        """[-1, 1] -> [low, high], float32."""
        a = self.low + (np.asarray(u, np.float32) + 1) * 0.5 * (self.high - self.low)
        return np.clip(a, self.low, self.high).astype(np.float32)

    def from_env(self, actions: np.ndarray) -> np.ndarray:
        """[low, high] -> [-1, 1], float32."""
        return (2 * (np.asarray(actions, np.float32) - self.low) / (self.high - self.low) - 1).astype(np.float32)

    # -- players ----------------------------------------------------------------
    def initial_memory(self, batch_size):
        if self.args.noise == "ou":
            return {"ou": np.zeros((batch_size, self.n_act), np.float32)}
        if self.args.noise == "param":
            return {"fresh": np.ones(batch_size, np.float32)}
        return {}

    def policy(self, obs: torch.Tensor) -> torch.Tensor:
        """The greedy action in [-1, 1]."""
        raise NotImplementedError

    def explore(self, obs: torch.Tensor, memory: dict) -> tuple[np.ndarray, dict]:
        """Actions in [-1, 1] (before clipping) with the exploration noise, and the new memory."""
        a, s = self.args, self.noise_scale
        mu = self.policy(obs).cpu().numpy()
        if a.noise == "gaussian":
            return mu + s * self.rng.standard_normal(mu.shape), memory
        if a.noise == "ou":
            x = memory["ou"] * (1 - a.ou_theta * a.ou_dt) + s * math.sqrt(a.ou_dt) * self.rng.standard_normal(mu.shape)
            return mu + x, {**memory, "ou": x.astype(np.float32)}
        if a.noise == "param":
            perturbed = self.perturbed_policy(obs, memory["fresh"]).cpu().numpy()
            distance = float(np.sqrt(np.mean((perturbed - mu) ** 2)))
            self.param_sigma *= a.param_adapt if distance < s else 1 / a.param_adapt
            return perturbed, {**memory, "fresh": np.zeros_like(memory["fresh"])}
        return mu, memory

    def perturbed_policy(self, obs: torch.Tensor, fresh: np.ndarray) -> torch.Tensor:
        """mu(s) of each environment's perturbed policy, theta + sigma eps; eps drawn anew where ``fresh``."""
        layers = self.policy_layers()
        B = len(obs)
        if self.param_eps is None or len(self.param_eps[0][0]) != B:
            self.param_eps = [(obs.new_empty(B, *m.weight.shape), obs.new_empty(B, *m.bias.shape)) for m in layers]
            fresh = np.ones(B)
        new = torch.as_tensor(np.flatnonzero(fresh), device=obs.device)
        for w, b in self.param_eps:
            w[new], b[new] = torch.randn_like(w[new]), torch.randn_like(b[new])
        h = obs
        for i, (m, (w, b)) in enumerate(zip(layers, self.param_eps, strict=True)):
            h = F.linear(h, m.weight, m.bias) + self.param_sigma * ((w @ h[:, :, None])[:, :, 0] + b)
            h = torch.relu(h) if i < len(layers) - 1 else torch.tanh(h)
        return h

    def policy_layers(self) -> list[nn.Linear]:
        raise NotImplementedError(f"{self.args.algo} has no deterministic policy to perturb")

    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        B = len(observations)
        if not greedy and self.args.random_warmup and self.updates == 0:  # no trained params yet
            return self.to_env(self.rng.uniform(-1, 1, (B, self.n_act))), memory
        obs = torch.as_tensor(np.asarray(observations), dtype=torch.float32, device=self.device)
        if greedy:
            u = self.policy(obs).cpu().numpy()
        else:
            u, memory = self.explore(obs, memory)
        return self.to_env(np.clip(u, -1, 1)), memory

    def session_info(self):
        info = {"noise": self.noise_scale}
        if self.args.noise == "param":
            info["param_sigma"] = self.param_sigma
        return info

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        self.device = pick_device()
        for net in self.nets().values():
            net.to(self.device)

    def next_value(self, obs: torch.Tensor) -> torch.Tensor:
        """What the targets bootstrap from: the value of ``obs`` under the target networks, (N,)."""
        raise NotImplementedError

    def critic_targets(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's (observations, actions in [-1, 1], TD targets), flattened to N = B x T transitions."""
        a, d = self.args, self.device
        t = nstep_transitions(batch, a.n_step, a.gamma)
        obs = torch.as_tensor(t.observations, dtype=torch.float32, device=d).flatten(0, 1)
        actions = torch.as_tensor(self.from_env(t.actions), device=d).flatten(0, 1)
        with torch.no_grad():
            value = self.next_value(torch.as_tensor(t.next_observations, dtype=torch.float32, device=d).flatten(0, 1))
            returns, discounts = (torch.as_tensor(x, device=d).flatten() for x in (t.returns, t.discounts))
            target = returns + discounts * value
        return obs, actions, target

    def update(self, obs, actions, target) -> dict[str, float]:
        """One gradient step of every network on N transitions; the metrics."""
        raise NotImplementedError

    def train_step(self, batch):
        metrics = self.update(*self.critic_targets(batch))
        self.updates += 1
        return metrics

    # -- params -----------------------------------------------------------------
    def extra_params(self) -> dict[str, np.ndarray]:
        return {}

    def get_params(self):
        return get_weights(self.nets()) | self.extra_params() | {"updates": np.array(self.updates, np.int64)}

    def set_params(self, params):
        load_weights(self.nets(), params)
        self.updates = int(params["updates"])


class DDPG(Continuous):
    """DDPG, and TD3 with ``twin``: the DDPG class with clipped double-Q, smoothing and delay switched on."""

    twin = False

    def build(self):
        h, n_obs, n_act = self.hidden, self.n_obs, self.n_act
        self.actor, self.q1 = Actor(n_obs, n_act, h), Critic(n_obs, n_act, h)
        self.target_actor, self.target_q1 = Actor(n_obs, n_act, h), Critic(n_obs, n_act, h)
        self.target_actor.load_state_dict(self.actor.state_dict())
        self.target_q1.load_state_dict(self.q1.state_dict())
        if self.twin:
            self.q2, self.target_q2 = Critic(n_obs, n_act, h), Critic(n_obs, n_act, h)
            self.target_q2.load_state_dict(self.q2.state_dict())
        self.critic_updates = 0  # this trainer's, for the policy delay

    def nets(self):
        nets = {"actor": self.actor, "q1": self.q1, "target.actor": self.target_actor, "target.q1": self.target_q1}
        return nets | ({"q2": self.q2, "target.q2": self.target_q2} if self.twin else {})

    def critics(self) -> list[nn.Module]:
        return [self.q1, self.q2] if self.twin else [self.q1]

    def policy(self, obs):
        return self.actor(obs)

    def policy_layers(self):
        return self.actor.policy_layers()

    def prepare_training(self):
        super().prepare_training()
        lr = self.args.learning_rate
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=lr)
        self.critic_optimizer = torch.optim.Adam([p for q in self.critics() for p in q.parameters()], lr=lr)

    def next_value(self, obs):
        a = self.args
        act = self.target_actor(obs)
        if not self.twin:
            return self.target_q1(obs, act)
        noise = (a.target_noise * torch.randn_like(act)).clamp(-a.target_noise_clip, a.target_noise_clip)
        act = (act + noise).clamp(-1, 1)  # target policy smoothing
        return torch.min(self.target_q1(obs, act), self.target_q2(obs, act))  # clipped double Q

    def update(self, obs, actions, target):
        a = self.args
        qs = [q(obs, actions) for q in self.critics()]
        critic_loss = sum(F.mse_loss(q, target) for q in qs)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()
        self.critic_updates += 1
        metrics = {"loss": critic_loss.item(), "q": qs[0].mean().item()}
        if self.critic_updates % (a.policy_delay if self.twin else 1) == 0:
            actor_loss = -self.q1(obs, self.actor(obs)).mean()
            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            soft_update(self.target_actor, self.actor, a.tau)
            soft_update(self.target_q1, self.q1, a.tau)
            if self.twin:
                soft_update(self.target_q2, self.q2, a.tau)
            metrics["actor_loss"] = actor_loss.item()
        return metrics


class TD3(DDPG):
    twin = True


class SAC(Continuous):
    def build(self):
        h, n_obs, n_act = self.hidden, self.n_obs, self.n_act
        self.actor = GaussianActor(n_obs, n_act, h)
        self.q1, self.q2 = Critic(n_obs, n_act, h), Critic(n_obs, n_act, h)
        self.target_q1, self.target_q2 = Critic(n_obs, n_act, h), Critic(n_obs, n_act, h)
        self.target_q1.load_state_dict(self.q1.state_dict())
        self.target_q2.load_state_dict(self.q2.state_dict())
        self.log_alpha = torch.tensor(math.log(self.args.alpha), requires_grad=True)
        self.target_entropy = -float(n_act)

    def nets(self):
        return {
            "actor": self.actor,
            "q1": self.q1,
            "q2": self.q2,
            "target.q1": self.target_q1,
            "target.q2": self.target_q2,
        }

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    def policy(self, obs):
        return torch.tanh(self.actor(obs)[0])

    def explore(self, obs, memory):
        return self.actor.sample(obs)[0].cpu().numpy(), memory

    def session_info(self):
        return super().session_info() | {"alpha": self.alpha}

    def prepare_training(self):
        super().prepare_training()
        lr = self.args.learning_rate
        self.log_alpha = self.log_alpha.detach().to(self.device).requires_grad_(True)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=lr)
        self.critic_optimizer = torch.optim.Adam([*self.q1.parameters(), *self.q2.parameters()], lr=lr)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=lr)

    def next_value(self, obs):
        act, logp = self.actor.sample(obs)
        q = torch.min(self.target_q1(obs, act), self.target_q2(obs, act))
        return q - self.log_alpha.exp() * logp  # the soft value: Q plus the entropy bonus

    def update(self, obs, actions, target):
        a = self.args
        q1, q2 = self.q1(obs, actions), self.q2(obs, actions)
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()
        act, logp = self.actor.sample(obs)
        alpha = self.log_alpha.exp().detach()
        actor_loss = (alpha * logp - torch.min(self.q1(obs, act), self.q2(obs, act))).mean()
        self.actor_optimizer.zero_grad()
        actor_loss.backward()
        self.actor_optimizer.step()
        if a.autotune:
            alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad()
            alpha_loss.backward()
            self.alpha_optimizer.step()
        soft_update(self.target_q1, self.q1, a.tau)
        soft_update(self.target_q2, self.q2, a.tau)
        metrics = {"loss": critic_loss.item(), "q": q1.mean().item(), "actor_loss": actor_loss.item()}
        return metrics | {"alpha": self.alpha, "entropy": -logp.mean().item()}

    def extra_params(self):
        return {"log_alpha": self.log_alpha.detach().cpu().numpy().copy()}

    def set_params(self, params):
        super().set_params(params)
        with torch.no_grad():
            self.log_alpha.copy_(torch.from_numpy(params["log_alpha"]))


class NAF(Continuous):
    def build(self):
        self.net, self.target = NAFNet(self.n_obs, self.n_act, self.hidden), NAFNet(self.n_obs, self.n_act, self.hidden)
        self.target.load_state_dict(self.net.state_dict())

    def nets(self):
        return {"naf": self.net, "target.naf": self.target}

    def policy(self, obs):
        return self.net(obs)[1]

    def policy_layers(self):
        return self.net.policy_layers()

    def prepare_training(self):
        super().prepare_training()
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=self.args.learning_rate)

    def next_value(self, obs):
        return self.target(obs)[0]  # max_a Q'(s', a) = V'(s')

    def update(self, obs, actions, target):
        q = self.net.q(obs, actions)
        loss = F.mse_loss(q, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        soft_update(self.target, self.net, self.args.tau)
        return {"loss": loss.item(), "q": q.mean().item()}


def make_experiment(db, args: Args):
    return {"ddpg": DDPG, "td3": TD3, "sac": SAC, "naf": NAF}[args.algo](db, args)
