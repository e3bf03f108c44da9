"""SAC: soft actor-critic for continuous (Box) actions, in PyTorch (CleanRL style: one file).

    pip install -e '.[examples]'                          # LunarLander, BipedalWalker: '.[examples,box2d]'
    python -m tinyverse examples/sac.py run -n 20000                          # Pendulum-v1, RL-Zoo's preset
    python -m tinyverse examples/sac.py eval -n 3                             # greedy episodes, mp4s in ./records
    python -m tinyverse examples/sac.py run --set env_id=LunarLanderContinuous-v3 --prefix lunar

Off-policy, from uniform replay of the recorded sessions. The policy is a tanh-squashed Gaussian; twin
critics regress on r + gamma (min Q'(s', a') - alpha log pi(a'|s')) with a' ~ pi(s'); the actor minimizes
alpha log pi(a|s) - min Q(s, a); the temperature alpha is tuned towards an entropy of -act_dim. Players
explore by sampling the policy. Networks act in [-1, 1], mapped onto the env's bounds. ``env_id`` picks
RL-Zoo's preset of the options left unset.

SAC: https://arxiv.org/abs/1801.01290, with the tuned temperature of https://arxiv.org/abs/1812.05905.
"""

import math
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from common import BoxActions, Critic, get_weights, load_weights, mlp, pick_device, soft_update

import tinyverse
from tinyverse import nstep_transitions

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0  # the policy's log-std clamp (SB3's)


@dataclass
class Args(tinyverse.Settings):
    # the core's settings (tinyverse.Settings) this file sets otherwise
    session_length: int = 4
    """ticks per recorded session (short: a batch's transitions correlate less)"""
    train_batch_size: int = 64
    """sessions per minibatch (default of train -b); each brings session_length transitions"""
    buffer_size: int | None = None
    """sessions the database keeps (None: buffer_transitions // session_length)"""
    local_params: tuple[str, ...] = ("target.*",)
    """with several trainers each keeps its own target critics"""
    updates_per_step: float | None = 1.0
    """the replay ratio: trainer updates per env step"""
    learning_starts: int | None = None
    """env steps played before the first update (None: the env_id's preset)"""
    # its own
    env_id: str = "Pendulum-v1"
    """the Gymnasium environment (a Box action space); it picks the preset of the options left unset"""
    random_warmup: bool = True
    """act uniformly at random until trained params (updates > 0) reach the player"""
    net_arch: str | None = None
    """hidden layer sizes, comma-separated, e.g. 400,300"""
    learning_rate: float | None = None
    """Adam step size of every network and of the temperature"""
    gamma: float | None = None
    """discount factor"""
    tau: float | None = None
    """soft target update: target <- (1 - tau) target + tau online, each update"""
    n_step: int = 1
    """n of n-step returns (1: one-step TD; the entropy bonus enters at the bootstrap state only)"""
    buffer_transitions: int | None = None
    """transitions the database keeps: buffer_size, in sessions, unless that is set"""
    autotune: bool = True
    """tune alpha towards the target entropy -act_dim (else alpha stays fixed)"""
    alpha: float = 1.0
    """the entropy coefficient, initial when autotuned (SB3's 1.0)"""
    seed: int = -1
    """seed of the networks' initial weights (-1: random)"""

    def __post_init__(self):
        """Fill the options left unset from the env_id's preset: the stored options are complete."""
        for key, value in {**DEFAULTS, **PRESETS.get(self.env_id, {})}.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        if self.buffer_size is None:
            self.buffer_size = max(1, self.buffer_transitions // self.session_length)


# SB3's SAC defaults, for any env_id without a preset
DEFAULTS = dict(
    net_arch="256,256", learning_rate=3e-4, gamma=0.99, tau=0.005, buffer_transitions=1_000_000, learning_starts=100
)
PRESETS = {  # RL-Zoo's hyperparams/sac.yml
    "Pendulum-v1": dict(learning_rate=1e-3),
    "LunarLanderContinuous-v3": dict(net_arch="400,300", learning_rate=7.3e-4, tau=0.01, learning_starts=10_000),
    "BipedalWalker-v3": dict(
        net_arch="400,300",
        learning_rate=7.3e-4,
        buffer_transitions=300_000,
        gamma=0.98,
        tau=0.02,
        learning_starts=10_000,
    ),
}


def squashed_log_prob(u, mean, log_std):
    """log pi(tanh(u)) of u ~ N(mean, exp(log_std)^2), summed over the action's dimensions.

    The density of a = tanh(u) is that of u divided by |da/du| = 1 - tanh(u)^2, whose log is written
    2 (log 2 - u - softplus(-2u)) to stay finite where tanh(u) rounds to +-1.
    """
    z = (u - mean) / log_std.exp()
    gaussian = -0.5 * z**2 - log_std - 0.5 * math.log(2 * math.pi)
    return (gaussian - 2 * (math.log(2) - u - F.softplus(-2 * u))).sum(-1)


class GaussianActor(nn.Module):
    """The policy: a = tanh(u), u ~ N(mean(s), std(s)^2)."""

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


class SAC(tinyverse.Experiment):
    def __init__(self, args: Args | None = None):
        self.args = a = args or Args()
        super().__init__(a)  # the core reads its settings (the pace, the batch, the buffer) there
        assert a.n_step >= 1, "n_step must be at least 1"
        env = self.make_env()
        assert len(env.observation_space.shape) == 1, "only vector observations"
        self.box = BoxActions(env.action_space)
        self.n_obs, self.n_act = env.observation_space.shape[0], self.box.n
        env.close()
        if a.seed >= 0:
            torch.manual_seed(a.seed)
        h, n_obs, n_act = [int(x) for x in a.net_arch.split(",")], self.n_obs, self.n_act
        self.actor = GaussianActor(n_obs, n_act, h)
        self.q1, self.q2 = Critic(n_obs, n_act, h), Critic(n_obs, n_act, h)
        self.target_q1, self.target_q2 = Critic(n_obs, n_act, h), Critic(n_obs, n_act, h)
        self.target_q1.load_state_dict(self.q1.state_dict())
        self.target_q2.load_state_dict(self.q2.state_dict())
        self.nets = {"actor": self.actor, "q1": self.q1, "q2": self.q2}
        self.nets |= {"target.q1": self.target_q1, "target.q2": self.target_q2}
        self.log_alpha = torch.tensor(math.log(a.alpha), requires_grad=True)
        self.target_entropy = -float(n_act)
        self.device = torch.device("cpu")  # trainers move to $TINYVERSE_DEVICE in prepare_training
        self.updates = 0  # all trainers' updates (params merge it); players act at random while it is 0
        self.rng = np.random.default_rng()

    def make_env(self, render_mode=None):
        return gym.make(self.args.env_id, render_mode=render_mode)

    @property
    def alpha(self) -> float:
        return float(self.log_alpha.detach().exp())

    # -- players ----------------------------------------------------------------
    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        B = len(observations)
        if not greedy and self.args.random_warmup and self.updates == 0:  # no trained params yet
            return self.box.to_env(self.rng.uniform(-1, 1, (B, self.n_act))), memory
        obs = torch.as_tensor(np.asarray(observations), dtype=torch.float32, device=self.device)
        if greedy:  # the mean action
            u = torch.tanh(self.actor(obs)[0])
        else:  # exploration: a sample of the policy
            u = self.actor.sample(obs)[0]
        return self.box.to_env(np.clip(u.cpu().numpy(), -1, 1)), memory

    def session_info(self):
        return {"alpha": self.alpha}

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        self.device = pick_device()
        for net in self.nets.values():
            net.to(self.device)
        lr = self.args.learning_rate
        self.log_alpha = self.log_alpha.detach().to(self.device).requires_grad_(True)
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=lr)
        self.critic_optimizer = torch.optim.Adam([*self.q1.parameters(), *self.q2.parameters()], lr=lr)
        self.alpha_optimizer = torch.optim.Adam([self.log_alpha], lr=lr)

    def critic_targets(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's (observations, actions in [-1, 1], TD targets), flattened to N = B x T transitions:
        r + gamma^m (min Q'(s', a') - alpha log pi(a'|s')), a' ~ pi(s'): the soft value, Q plus the entropy."""
        a, d = self.args, self.device
        t = nstep_transitions(batch, a.n_step, a.gamma)
        obs = torch.as_tensor(t.observations, dtype=torch.float32, device=d).flatten(0, 1)
        actions = torch.as_tensor(self.box.from_env(t.actions), device=d).flatten(0, 1)
        next_obs = torch.as_tensor(t.next_observations, dtype=torch.float32, device=d).flatten(0, 1)
        with torch.no_grad():
            next_act, next_logp = self.actor.sample(next_obs)
            q = torch.min(self.target_q1(next_obs, next_act), self.target_q2(next_obs, next_act))
            value = q - self.log_alpha.exp() * next_logp
            returns = torch.as_tensor(t.returns, device=d).flatten()
            target = returns + torch.as_tensor(t.discounts, device=d).flatten() * value
        return obs, actions, target

    def train_step(self, batch):
        a = self.args
        obs, actions, target = self.critic_targets(batch)
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
        if a.autotune:  # alpha grows while the policy's entropy is below the target, shrinks above it
            alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
            self.alpha_optimizer.zero_grad()
            alpha_loss.backward()
            self.alpha_optimizer.step()
        soft_update(self.target_q1, self.q1, a.tau)
        soft_update(self.target_q2, self.q2, a.tau)
        self.updates += 1
        metrics = {"loss": critic_loss.item(), "q": q1.mean().item(), "actor_loss": actor_loss.item()}
        return metrics | {"alpha": self.alpha, "entropy": -logp.mean().item()}

    # -- params -----------------------------------------------------------------
    def get_params(self):
        log_alpha = {"log_alpha": self.log_alpha.detach().cpu().numpy().copy()}
        return get_weights(self.nets) | log_alpha | {"updates": np.array(self.updates, np.int64)}

    def set_params(self, params):
        load_weights(self.nets, params)
        with torch.no_grad():
            self.log_alpha.copy_(torch.from_numpy(params["log_alpha"]))
        self.updates = int(params["updates"])


def make_experiment(args: Args):
    return SAC(args)
