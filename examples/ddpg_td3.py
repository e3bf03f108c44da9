"""DDPG and TD3: a deterministic policy and its critics, for continuous (Box) actions, in PyTorch (CleanRL style).

    pip install -e '.[examples]'                          # LunarLander, BipedalWalker: '.[examples,box2d]'
    python -m tinyverse examples/ddpg_td3.py run -n 20000                  # TD3 on Pendulum-v1, RL-Zoo's preset
    python -m tinyverse examples/ddpg_td3.py run --players 4 --set algo=ddpg --set noise=ou --prefix pendulum-ou
    python -m tinyverse examples/ddpg_td3.py eval -n 3                     # greedy episodes, mp4s in ./records
    python -m tinyverse examples/ddpg_td3.py run --set env_id=BipedalWalker-v3 --prefix walker

Off-policy, from uniform replay of the recorded sessions. The critic regresses Q(s, a) on
r + gamma Q'(s', mu'(s')) and the actor climbs Q(s, mu(s)); ``algo=td3`` adds clipped double Q,
target policy smoothing and delayed actor updates. Networks act in [-1, 1], mapped onto the env's
bounds. Exploration (``noise``): gaussian, Ornstein-Uhlenbeck, parameter-space or none, at a scale
spread over the players as in Ape-X. ``env_id`` picks RL-Zoo's preset of the options left unset.

DDPG: https://arxiv.org/abs/1509.02971 (DPG: http://proceedings.mlr.press/v32/silver14.html).
TD3: https://arxiv.org/abs/1802.09477. Parameter noise: https://arxiv.org/abs/1706.01905.
"""

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from common import ActionNoise, BoxActions, Critic, get_weights, load_weights, mlp, pick_device, soft_update

import tinyverse
from tinyverse import nstep_transitions
from tinyverse.explore import apex_spread, player_slot


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
    """with several trainers each keeps its own target networks"""
    updates_per_step: float | None = 1.0
    """the replay ratio: trainer updates per env step"""
    learning_starts: int | None = None
    """env steps played before the first update (None: the env_id's preset)"""
    # its own
    env_id: str = "Pendulum-v1"
    """the Gymnasium environment (a Box action space); it picks the preset of the options left unset"""
    algo: str = "td3"
    """ddpg or td3"""
    noise: str = "gaussian"
    """exploration: gaussian, ou, param or none"""
    noise_std: float | None = None
    """scale s of the exploration noise in [-1, 1] units (param noise: its target action distance)"""
    noise_spread: float = 2.0
    """Ape-X: player i of n explores with noise_std * noise_spread ** (1 - 2q), q = (i + 1/2) / n"""
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
    """Adam step size of the actor and the critics"""
    gamma: float | None = None
    """discount factor"""
    tau: float | None = None
    """soft target update: target <- (1 - tau) target + tau online, each actor update"""
    n_step: int = 1
    """n of n-step returns (1: one-step TD)"""
    buffer_transitions: int | None = None
    """transitions the database keeps: buffer_size, in sessions, unless that is set"""
    policy_delay: int = 2
    """TD3: critic updates per actor and target update"""
    target_noise: float = 0.2
    """TD3: std of the target policy smoothing noise"""
    target_noise_clip: float = 0.5
    """TD3: the smoothing noise is clipped to +- this"""
    seed: int = -1
    """seed of the networks' initial weights (-1: random)"""

    def __post_init__(self):
        """Fill the options left unset from the env_id's preset: the stored options are complete."""
        if self.algo not in ("ddpg", "td3"):
            raise tinyverse.TinyverseError(f"algo={self.algo}: choose ddpg or td3 (sac.py, naf.py: the others)")
        if self.noise not in ActionNoise.KINDS:
            raise tinyverse.TinyverseError(f"noise={self.noise}: choose one of {', '.join(ActionNoise.KINDS)}")
        for key, value in {**DEFAULTS, **PRESETS.get(self.env_id, {})}.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        if self.buffer_size is None:
            self.buffer_size = max(1, self.buffer_transitions // self.session_length)


# SB3's TD3 defaults (DDPG's alike), for any env_id without a preset
DEFAULTS = dict(
    net_arch="256,256",
    learning_rate=1e-3,
    gamma=0.99,
    tau=0.005,
    buffer_transitions=1_000_000,
    learning_starts=100,
    noise_std=0.1,
)
# RL-Zoo (hyperparams/td3.yml; ddpg.yml has the same entries for these three envs)
ZOO = DEFAULTS | dict(net_arch="400,300", gamma=0.98, buffer_transitions=200_000, learning_starts=10_000)
PRESETS = {env: ZOO for env in ("Pendulum-v1", "LunarLanderContinuous-v3", "BipedalWalker-v3")}


class Actor(nn.Module):
    """The deterministic policy mu(s) in [-1, 1]^act_dim."""

    def __init__(self, n_obs: int, n_act: int, hidden: list[int]):
        super().__init__()
        self.net = mlp([n_obs, *hidden, n_act])

    def forward(self, obs):
        return torch.tanh(self.net(obs))

    def policy_layers(self) -> list[nn.Linear]:
        """The Linear layers from observation to mu, ReLU between them, tanh after (for parameter noise)."""
        return [m for m in self.net if isinstance(m, nn.Linear)]


class DDPG(tinyverse.Experiment):
    """DDPG, and TD3 with ``algo=td3``: two critics, target policy smoothing, delayed actor updates."""

    def __init__(self, args: Args | None = None):
        self.args = a = args or Args()
        super().__init__(a)  # the core reads its settings (the pace, the batch, the buffer) there
        assert a.n_step >= 1 and a.policy_delay >= 1, "n_step and policy_delay must be at least 1"
        env = self.make_env()
        assert len(env.observation_space.shape) == 1, "only vector observations"
        self.box = BoxActions(env.action_space)
        self.n_obs, self.n_act = env.observation_space.shape[0], self.box.n
        env.close()
        if a.seed >= 0:
            torch.manual_seed(a.seed)
        self.twin = a.algo == "td3"
        h, n_obs, n_act = [int(x) for x in a.net_arch.split(",")], self.n_obs, self.n_act
        self.actor, self.target_actor = Actor(n_obs, n_act, h), Actor(n_obs, n_act, h)
        self.q1, self.target_q1 = Critic(n_obs, n_act, h), Critic(n_obs, n_act, h)
        self.nets = {"actor": self.actor, "q1": self.q1, "target.actor": self.target_actor, "target.q1": self.target_q1}
        if self.twin:
            self.q2, self.target_q2 = Critic(n_obs, n_act, h), Critic(n_obs, n_act, h)
            self.nets |= {"q2": self.q2, "target.q2": self.target_q2}
        for name, net in self.nets.items():
            if name.startswith("target."):
                net.load_state_dict(self.nets[name.removeprefix("target.")].state_dict())
        self.device = torch.device("cpu")  # trainers move to $TINYVERSE_DEVICE in prepare_training
        self.updates = 0  # all trainers' updates (params merge it); players act at random while it is 0
        self.critic_updates = 0  # this trainer's, for the policy delay
        self.rng = np.random.default_rng()
        scale = 0.0 if a.noise == "none" else apex_spread(a.noise_std, a.noise_spread, *player_slot(a.noise_players))
        self.noise = ActionNoise(a.noise, scale, a.ou_theta, a.ou_dt, a.param_init_std, a.param_adapt)

    def make_env(self, render_mode=None):
        return gym.make(self.args.env_id, render_mode=render_mode)

    # -- players ----------------------------------------------------------------
    def initial_memory(self, batch_size):
        return self.noise.initial_memory(batch_size, self.n_act)

    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        B = len(observations)
        if not greedy and self.args.random_warmup and self.updates == 0:  # no trained params yet
            return self.box.to_env(self.rng.uniform(-1, 1, (B, self.n_act))), memory
        obs = torch.as_tensor(np.asarray(observations), dtype=torch.float32, device=self.device)
        u = self.actor(obs).cpu().numpy()
        if not greedy:
            u, memory = self.noise(obs, u, self.actor.policy_layers(), memory)
        return self.box.to_env(np.clip(u, -1, 1)), memory

    def session_info(self):
        return self.noise.info()

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        self.device = pick_device()
        for net in self.nets.values():
            net.to(self.device)
        lr = self.args.learning_rate
        critics = [self.q1, self.q2] if self.twin else [self.q1]
        self.actor_optimizer = torch.optim.Adam(self.actor.parameters(), lr=lr)
        self.critic_optimizer = torch.optim.Adam([p for q in critics for p in q.parameters()], lr=lr)

    def critic_targets(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's (observations, actions in [-1, 1], TD targets), flattened to N = B x T transitions:
        r + gamma^m Q'(s', mu'(s')); TD3: the smaller target critic, at mu'(s') plus clipped noise."""
        a, d = self.args, self.device
        t = nstep_transitions(batch, a.n_step, a.gamma)
        obs = torch.as_tensor(t.observations, dtype=torch.float32, device=d).flatten(0, 1)
        actions = torch.as_tensor(self.box.from_env(t.actions), device=d).flatten(0, 1)
        next_obs = torch.as_tensor(t.next_observations, dtype=torch.float32, device=d).flatten(0, 1)
        with torch.no_grad():
            next_act = self.target_actor(next_obs)
            if self.twin:  # target policy smoothing, then clipped double Q
                noise = (a.target_noise * torch.randn_like(next_act)).clamp(-a.target_noise_clip, a.target_noise_clip)
                next_act = (next_act + noise).clamp(-1, 1)
                value = torch.min(self.target_q1(next_obs, next_act), self.target_q2(next_obs, next_act))
            else:
                value = self.target_q1(next_obs, next_act)
            returns = torch.as_tensor(t.returns, device=d).flatten()
            target = returns + torch.as_tensor(t.discounts, device=d).flatten() * value
        return obs, actions, target

    def train_step(self, batch):
        a = self.args
        obs, actions, target = self.critic_targets(batch)
        critics = [self.q1, self.q2] if self.twin else [self.q1]
        qs = [q(obs, actions) for q in critics]
        critic_loss = sum(F.mse_loss(q, target) for q in qs)
        self.critic_optimizer.zero_grad()
        critic_loss.backward()
        self.critic_optimizer.step()
        self.critic_updates += 1
        self.updates += 1
        metrics = {"loss": critic_loss.item(), "q": qs[0].mean().item()}
        if self.critic_updates % (a.policy_delay if self.twin else 1) == 0:
            actor_loss = -self.q1(obs, self.actor(obs)).mean()  # the deterministic policy gradient
            self.actor_optimizer.zero_grad()
            actor_loss.backward()
            self.actor_optimizer.step()
            for name, net in self.nets.items():
                if name.startswith("target."):
                    soft_update(net, self.nets[name.removeprefix("target.")], a.tau)
            metrics["actor_loss"] = actor_loss.item()
        return metrics

    # -- params -----------------------------------------------------------------
    def get_params(self):
        return get_weights(self.nets) | {"updates": np.array(self.updates, np.int64)}

    def set_params(self, params):
        load_weights(self.nets, params)
        self.updates = int(params["updates"])


def make_experiment(args: Args):
    return DDPG(args)
