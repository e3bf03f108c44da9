"""A2C on Atari Pong from pixels, in PyTorch (CleanRL style: one file).

    python -m tinyverse examples/atari_a2c.py run --players 2 -n 2000000   # a local fleet
    python -m tinyverse examples/atari_a2c.py run --set max_episode_steps=400 --device cpu   # options
    python -m tinyverse examples/atari_a2c.py plot -o pong.png             # the return curve
    python -m tinyverse examples/atari_a2c.py eval -n 5                    # 5 games, mp4s in ./records

Frames are uint8 from the emulator to the trainer's GPU. Each frame is stored
once: the observation is one 80x80 grayscale frame, and the agent's window of
the last 4 frames is its *memory* (the previous 3 frames), which players store
once per session; the trainer rebuilds every tick's window from that memory and
the session's frames (``wrappers.window_indices``): 4x fewer raw bytes than
stacking (2.7x once the database's zlib has squeezed both, bench/atari.py).

A2C (https://arxiv.org/abs/1602.01783) with GAE (https://arxiv.org/abs/1506.02438):
advantages are computed inside each 25-tick session, cut where an episode ends
(terminated: no bootstrap; truncated: bootstrap from the episode's final
window), bootstrapped from the value of the window after the last tick.

Options (``Args``) come from ``--set name=value`` (e.g. ``--set max_episode_steps=40`` for
short tests); the first worker stores them and the others adopt them. The trainer's device is
per process, not an option: ``--device`` / ``TINYVERSE_DEVICE`` = auto (default: CUDA when
available) | cpu | cuda.

A2C is on-policy: its gradient is only right for data of the current policy. The trainer samples
among the newest ``recent_sessions`` sessions and uses each one ``max_reuse`` times on average;
the core's loops hold that as a pace: each update samples ``train_batch_size`` sessions of
``session_length`` ticks, so updates_per_step = max_reuse / (train_batch_size x session_length)
(2 / 400 = 0.005: one update per 200 env steps). The trainer waits while it is ahead of that
(it used to wait for fresh sessions inside ``sample``, up to ``max_wait`` seconds, then reuse the
newest ones anyway; it now waits as long as it takes, and publishes its params when it starts to
wait, so players act with fresh params). Players may run ``pace_slack`` = recent_sessions x
session_length env steps ahead (they used to never wait): sessions older than that are never
sampled. Publish often (``train -s 10``): the default, every 100 updates, is stale for A2C when
the trainer is the bottleneck.
"""

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import ale_py
import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn

import tinyverse

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the experiment is loaded by path: find its neighbour
from wrappers import ActionSubset, FrameMemory, Preprocess, window_indices  # noqa: E402

# torch's default thread count made a DQN run 4x slower with several processes on 2 cores
torch.set_num_threads(1)
gym.register_envs(ale_py)


@dataclass
class Args:
    env_id: str = "ALE/Pong-v5"
    """the Atari game (ALE v5: sticky actions with probability 0.25)"""
    actions: tuple[str, ...] = ("NOOP", "RIGHT", "LEFT")
    """the game's actions the agent may use (Pong: stay, up, down; FIRE does nothing useful)"""
    crop: tuple[int, int, int, int] = (34, 194, 0, 160)
    """(top, bottom, left, right) of the 210x160 screen kept: Pong's field without the score"""
    size: tuple[int, int] = (80, 80)
    """frame size after an area downscale (160 -> 80 is an exact 2x2 mean, cheaper than 84)"""
    frame_skip: int = 4
    """emulator frames per agent step, repeated by ALE in C++ (1.0-1.3x the rate of wrappers.FrameSkip)"""
    window: int = 4
    """frames the agent sees at once (the current one and 3 from its memory)"""
    max_episode_steps: int | None = None
    """truncate episodes after this many agent steps (None: the whole game)"""
    learning_rate: float = 5e-4
    """Adam step size"""
    gamma: float = 0.99
    """discount factor"""
    gae_lambda: float = 0.95
    """GAE lambda (1.0: n-step returns up to the end of the session)"""
    ent_coef: float = 0.01
    """entropy bonus: keeps the policy exploring"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    max_grad_norm: float = 0.5
    """gradient clipping (global L2 norm)"""
    clip_rewards: bool = True
    """train on sign(reward) (Pong's rewards are already -1/0/+1; episode returns stay raw)"""
    recent_sessions: int = 128
    """the trainer samples among the newest sessions only (A2C is on-policy)"""
    max_reuse: float = 2.0
    """the pace: the trainer waits for new sessions rather than use each one more than this on average"""

    def __post_init__(self):  # stored options come back from JSON as lists
        self.actions, self.crop, self.size = tuple(self.actions), tuple(self.crop), tuple(self.size)


def layer_init(layer: nn.Module, std: float = np.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal init as in OpenAI baselines / CleanRL."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


class ActorCritic(nn.Module):
    """The Nature-DQN convolutional torso with a policy head and a value head; uint8 frames in."""

    def __init__(self, window: int, size: tuple[int, int], n_actions: int):
        super().__init__()
        self.torso = nn.Sequential(
            layer_init(nn.Conv2d(window, 32, 8, stride=4)),
            nn.ReLU(),
            layer_init(nn.Conv2d(32, 64, 4, stride=2)),
            nn.ReLU(),
            layer_init(nn.Conv2d(64, 64, 3, stride=1)),
            nn.ReLU(),
            nn.Flatten(),
        )
        n_flat = self.torso(torch.zeros(1, window, *size)).shape[1]
        self.torso.append(layer_init(nn.Linear(n_flat, 512)))
        self.torso.append(nn.ReLU())
        self.policy = layer_init(nn.Linear(512, n_actions), std=0.01)
        self.value = layer_init(nn.Linear(512, 1), std=1.0)

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        hidden = self.torso(frames.float() / 255.0)  # uint8 until here, on whichever device
        return self.policy(hidden), self.value(hidden).squeeze(-1)


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    ended: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Generalized advantage estimates, (B, T), each summed only up to the end of its episode.

    ``next_values[:, t]`` is the value of what followed tick t: the next tick's,
    the final observation's where the episode was truncated, 0 where it
    terminated; ``ended`` cuts the sum where an episode ended.
    """
    deltas = rewards + gamma * next_values - values
    advantages = torch.zeros_like(deltas)
    running = torch.zeros_like(deltas[:, 0])
    for t in reversed(range(deltas.shape[1])):
        running = deltas[:, t] + gamma * lam * (~ended[:, t]) * running
        advantages[:, t] = running
    return advantages


class AtariA2C(tinyverse.Experiment):
    session_length = 25  # as in the original project
    buffer_size = 2000  # sessions (~50k frames): A2C only reads the newest `recent_sessions`
    play_batch_size = 4  # the policy's forward costs 1.4 ms for 1 window, 2 ms for 4 (bench/atari.py)
    train_batch_size = 16  # sessions: 400 transitions an update
    learning_starts = 0  # the trainer starts at its first batch (train_batch_size sessions)

    def __init__(self, db=None, args: Args | None = None):
        super().__init__(db)
        self.args = args or Args()
        env = self.make_env()
        assert isinstance(env.action_space, gym.spaces.Discrete), "only discrete actions"
        self.frames = FrameMemory(self.args.window, env.observation_space.shape)
        self.net = ActorCritic(self.args.window, env.observation_space.shape, int(env.action_space.n))
        env.close()
        self.device = torch.device("cpu")  # players act on the CPU; prepare_training picks the trainer's
        a = self.args  # the pace (see the module docstring)
        self.updates_per_step = a.max_reuse / (self.train_batch_size * self.session_length)
        self.pace_slack = a.recent_sessions * self.session_length

    def make_env(self, render_mode=None):
        a = self.args
        # grayscale from the emulator's palette: same luminance as Preprocess's, without the NumPy work
        env = gym.make(a.env_id, obs_type="grayscale", frameskip=a.frame_skip, render_mode=render_mode)
        # ALE says 30 fps for any frame skip: one frame per agent step at 60/skip fps plays at real speed
        env.metadata = {**env.metadata, "render_fps": 60 // a.frame_skip}
        env = Preprocess(ActionSubset(env, a.actions), crop=a.crop, size=a.size)
        if a.max_episode_steps:
            env = gym.wrappers.TimeLimit(env, a.max_episode_steps)
        return env

    # -- players ----------------------------------------------------------------
    def initial_memory(self, batch_size):
        return self.frames.initial(batch_size)

    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        window, memory = self.frames.push(observations, memory)
        logits, _ = self.net(torch.from_numpy(window).to(self.device))
        if greedy:
            actions = logits.argmax(1)
        else:  # torch.multinomial: the same draw as Categorical.sample without its ~0.1 ms of checks
            actions = torch.multinomial(logits.softmax(1), 1)[:, 0]
        return actions.cpu().numpy(), memory

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        a, device = self.args, os.environ.get("TINYVERSE_DEVICE", "auto")  # per process: not an option
        if device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            assert not device.startswith("cuda") or torch.cuda.is_available(), f"device {device} but no CUDA device"
            self.device = torch.device(device)
        self.net.to(self.device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=a.learning_rate, eps=1e-5)

    def sample(self, db, batch_size):
        # A2C is on-policy: sample among the newest sessions only (the pace keeps them fresh),
        # and note how many params versions behind the current ones each session was played
        lo, hi = db.session_range()
        lo = max(lo, hi - max(self.args.recent_sessions, batch_size) + 1)
        if hi - lo + 1 < batch_size:
            return {}
        ids = np.random.default_rng().choice(np.arange(lo, hi + 1), batch_size, replace=False)
        batch = db.get_batch(ids.tolist())
        if batch:
            batch["policy_lag"] = (db.params_version() or 0) - batch["version"]
        return batch

    def train_step(self, batch):
        a, d = self.args, self.device
        B, T = batch["rewards"].shape
        terminated, truncated = batch["terminated"], batch["truncated"]
        idx, final_idx = window_indices(terminated, truncated, a.window)
        # every frame of the session once, on the device, uint8: [zero, memory, observations, finals]
        obs = torch.from_numpy(batch["observations"]).to(d)
        seq = torch.cat(
            [
                torch.zeros_like(obs[:, :1]),
                torch.from_numpy(batch["memory.frames"]).to(d),
                obs,
                torch.from_numpy(batch["final_observations"]).to(d),
            ],
            dim=1,
        )
        rows = torch.arange(B, device=d)[:, None, None]
        windows = seq[rows, torch.from_numpy(idx).to(d)]  # (B, T+1, K, H, W)
        logits, values = self.net(windows.flatten(0, 1))
        logits, values = logits.view(B, T + 1, -1)[:, :T], values.view(B, T + 1)

        with torch.no_grad():
            next_values = values[:, 1:].clone()  # after an episode end this is the next episode's start...
            b, t = np.nonzero(truncated & ~terminated)
            if len(b):  # ...so a truncated episode bootstraps from its own final window
                final = seq[torch.from_numpy(b).to(d)[:, None], torch.from_numpy(final_idx[b, t]).to(d)]
                next_values[torch.from_numpy(b).to(d), torch.from_numpy(t).to(d)] = self.net(final)[1]
            next_values[torch.from_numpy(terminated).to(d)] = 0.0  # and a terminated one does not
            rewards = torch.from_numpy(batch["rewards"]).to(d)
            rewards = rewards.sign() if a.clip_rewards else rewards
            ended = torch.from_numpy(terminated | truncated).to(d)
            advantages = gae(rewards, values[:, :T], next_values, ended, a.gamma, a.gae_lambda)
            returns = advantages + values[:, :T]

        dist = torch.distributions.Categorical(logits=logits)
        actions = torch.from_numpy(batch["actions"]).to(d).long()
        pg_loss = -(dist.log_prob(actions) * advantages).mean()
        value_loss = 0.5 * ((returns - values[:, :T]) ** 2).mean()
        entropy = dist.entropy().mean()
        loss = pg_loss + a.vf_coef * value_loss - a.ent_coef * entropy
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.net.parameters(), a.max_grad_norm)
        self.optimizer.step()
        return {
            "loss": loss.item(),
            "pg_loss": pg_loss.item(),
            "value_loss": value_loss.item(),
            "entropy": entropy.item(),
            "grad_norm": grad_norm.item(),
            "value": values.mean().item(),
            "policy_lag": float(batch["policy_lag"].mean()) if "policy_lag" in batch else 0.0,
        }

    # -- params -----------------------------------------------------------------
    def get_params(self):
        return {k: v.detach().cpu().numpy().copy() for k, v in self.net.state_dict().items()}

    def set_params(self, params):
        self.net.load_state_dict({k: torch.from_numpy(params[k]) for k in self.net.state_dict()})


def make_experiment(db, args: Args):
    return AtariA2C(db, args)
