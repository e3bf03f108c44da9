"""NAF: Q-learning for continuous (Box) actions with normalized advantage functions, in PyTorch (CleanRL style).

    pip install -e '.[examples]'                          # LunarLander, BipedalWalker: '.[examples,box2d]'
    python -m tinyverse examples/naf.py run -n 20000 --set noise=ou          # Pendulum-v1
    python -m tinyverse examples/naf.py eval -n 3                            # greedy episodes, mp4s in ./records
    python -m tinyverse examples/naf.py run --set env_id=LunarLanderContinuous-v3 --prefix lunar

Off-policy, from uniform replay of the recorded sessions. One network gives V(s), mu(s) and a
lower-triangular L(s) with a positive diagonal, and Q(s, a) = V(s) - 1/2 (a - mu)^T L L^T (a - mu):
mu(s) is the greedy action and the target r + gamma V'(s') needs no maximization. Networks act in
[-1, 1], mapped onto the env's bounds. Exploration (``noise``): gaussian, Ornstein-Uhlenbeck,
parameter-space or none, at a scale spread over the players as in Ape-X. ``env_id`` picks the preset
of the options left unset.

NAF: https://arxiv.org/abs/1603.00748. Parameter noise: https://arxiv.org/abs/1706.01905.
"""

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from common import ActionNoise, BoxActions, get_weights, load_weights, mlp, pick_device, soft_update

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
    """with several trainers each keeps its own target network"""
    updates_per_step: float | None = 1.0
    """the replay ratio: trainer updates per env step"""
    learning_starts: int | None = None
    """env steps played before the first update (None: 10,000 on the Box2D games, else 100)"""
    # its own
    env_id: str = "Pendulum-v1"
    """the Gymnasium environment (a Box action space); it picks the preset of the options left unset"""
    noise: str = "gaussian"
    """exploration: gaussian, ou, param or none"""
    noise_std: float = 0.1
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
    net_arch: str = "256,256"
    """hidden layer sizes, comma-separated, e.g. 400,300"""
    learning_rate: float = 1e-3
    """Adam step size"""
    gamma: float = 0.99
    """discount factor"""
    tau: float = 0.005
    """soft target update: target <- (1 - tau) target + tau online, each update"""
    n_step: int = 1
    """n of n-step returns (1: one-step TD)"""
    buffer_transitions: int = 1_000_000
    """transitions the database keeps: buffer_size, in sessions, unless that is set"""
    seed: int = -1
    """seed of the networks' initial weights (-1: random)"""

    def __post_init__(self):
        """Fill the options left unset: the stored options are complete."""
        if self.noise not in ActionNoise.KINDS:
            raise tinyverse.TinyverseError(f"noise={self.noise}: choose one of {', '.join(ActionNoise.KINDS)}")
        if self.learning_starts is None:  # no RL-Zoo entry: SB3's TD3 defaults, and the zoo's 10k on Box2D
            box2d = self.env_id in ("LunarLanderContinuous-v3", "BipedalWalker-v3")
            self.learning_starts = 10_000 if box2d else 100
        if self.buffer_size is None:
            self.buffer_size = max(1, self.buffer_transitions // self.session_length)


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
        """The Linear layers from observation to mu, ReLU between them, tanh after (for parameter noise)."""
        return [*(m for m in self.trunk if isinstance(m, nn.Linear)), self.mu]


class NAF(tinyverse.Experiment):
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
        hidden = [int(x) for x in a.net_arch.split(",")]
        self.net, self.target = NAFNet(self.n_obs, self.n_act, hidden), NAFNet(self.n_obs, self.n_act, hidden)
        self.target.load_state_dict(self.net.state_dict())
        self.nets = {"naf": self.net, "target.naf": self.target}
        self.device = torch.device("cpu")  # trainers move to $TINYVERSE_DEVICE in prepare_training
        self.updates = 0  # all trainers' updates (params merge it); players act at random while it is 0
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
        u = self.net(obs)[1].cpu().numpy()  # mu(s): the action of the largest Q
        if not greedy:
            u, memory = self.noise(obs, u, self.net.policy_layers(), memory)
        return self.box.to_env(np.clip(u, -1, 1)), memory

    def session_info(self):
        return self.noise.info()

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        self.device = pick_device()
        for net in self.nets.values():
            net.to(self.device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=self.args.learning_rate)

    def critic_targets(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The batch's (observations, actions in [-1, 1], TD targets), flattened to N = B x T transitions:
        r + gamma^m V'(s'), as max_a Q'(s', a) = Q'(s', mu'(s')) = V'(s')."""
        a, d = self.args, self.device
        t = nstep_transitions(batch, a.n_step, a.gamma)
        obs = torch.as_tensor(t.observations, dtype=torch.float32, device=d).flatten(0, 1)
        actions = torch.as_tensor(self.box.from_env(t.actions), device=d).flatten(0, 1)
        next_obs = torch.as_tensor(t.next_observations, dtype=torch.float32, device=d).flatten(0, 1)
        with torch.no_grad():
            value = self.target(next_obs)[0]
            returns = torch.as_tensor(t.returns, device=d).flatten()
            target = returns + torch.as_tensor(t.discounts, device=d).flatten() * value
        return obs, actions, target

    def train_step(self, batch):
        obs, actions, target = self.critic_targets(batch)
        q = self.net.q(obs, actions)
        loss = F.mse_loss(q, target)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        soft_update(self.target, self.net, self.args.tau)
        self.updates += 1
        return {"loss": loss.item(), "q": q.mean().item()}

    # -- params -----------------------------------------------------------------
    def get_params(self):
        return get_weights(self.nets) | {"updates": np.array(self.updates, np.int64)}

    def set_params(self, params):
        load_weights(self.nets, params)
        self.updates = int(params["updates"])


def make_experiment(args: Args):
    return NAF(args)
