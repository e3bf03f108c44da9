"""Atari from pixels: APPO, an IMPALA-style actor-critic with V-trace, fed by any number of players (PyTorch).

    pip install -e '.[examples,atari,video]'                      # CarRacing: '.[examples,box2d,video]'
    python -m tinyverse atari.py run                     # Pong: 1 player + 1 trainer on this machine
    python -m tinyverse atari.py play -b 3               # or the parts, on as many machines as you have
    python -m tinyverse atari.py train -b 10
    python -m tinyverse atari.py eval -n 5               # 5 greedy games, an mp4 each in ./records
    python -m tinyverse atari.py run --set env_id=ALE/Breakout-v5    # any Atari game: its actions, whole screen
    python -m tinyverse atari.py run --set env_id=CarRacing-v3 --prefix racing   # the racing game (racing.py)

Players act with params a few versions old and record each action's log-probability (``outputs.logp``);
the trainer corrects for the lag with V-trace and takes PPO's clipped surrogate on its advantages
(``common.appo_loss``, which recurrent.py shares), so each recorded tick is trained on ``max_reuse``
times. Frames are the emulator's grayscale at 80x80, each stored once: the window of the last 4 is the
agent's memory (``FrameMemory``), rebuilt by the trainer. The network is the A3C paper's, channels-last; on
Atari games it sees each pixel normalized by that pixel's running mean and deviation (``normalize_input``).
The trainer's device: ``--device`` / ``TINYVERSE_DEVICE``. Measured results: docs/examples.rst.

IMPALA / V-trace: https://arxiv.org/abs/1802.01561. PPO: https://arxiv.org/abs/1707.06347. A3C: https://arxiv.org/abs/1602.01783.
"""

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import torch
import torch.nn as nn
from common import appo_loss, derive_pace, get_weights, layer_init, load_weights, prepare_appo, sample_recent
from wrappers import ActionSubset, Preprocess, window_indices

import tinyverse


@dataclass
class Args(tinyverse.Settings):
    # the core's settings (tinyverse.Settings) this file sets otherwise; None: from this file's batch_ticks,
    # max_reuse and recent_sessions (common.derive_pace)
    session_length: int = 25
    """ticks a player records per session (the original project's 25)"""
    buffer_size: int | None = 2000
    """sessions the database keeps (50k frames): the trainer reads the newest recent_sessions only"""
    play_batch_size: int = 8
    """default of play -b: environments a player runs at once, one forward for all of them"""
    train_batch_size: int | None = None
    """sessions an update (default of train -b; None: batch_ticks / session_length)"""
    save_every: int = 10
    """default of train -s: updates between publications, so that players act with fresh params"""
    updates_per_step: float | None = None
    """the pace (None: max_reuse / (train_batch_size x session_length))"""
    pace_slack: int | None = None
    """env steps either side may run ahead of the pace (None: recent_sessions x session_length / 2)"""
    # its own
    env_id: str = "ALE/Pong-v5"
    """the game: an Atari one (ALE/...) or CarRacing-v3; it picks the defaults of the options left unset"""
    sticky_actions: float = 0.0
    """probability that the emulator repeats the previous action (0: PongNoFrameskip-v4; ALE v5's default 0.25)"""
    noop_max: int | None = None
    """up to this many NOOPs at reset, so that greedy games differ (Atari: 30)"""
    actions: str | None = None
    """the game's actions the agent may use: names, ids or all (Atari: all; Pong: NOOP,RIGHT,LEFT: stay, up, down)"""
    crop: str | None = None
    """top,bottom,left,right of the screen kept (Atari: all of 210x160; Pong: 34,194,0,160, the field only)"""
    size: int | None = None
    """frames are area-downscaled to size x size (Atari: 84, as DQN's; Pong: 160 -> 80, an exact 2x2 mean)"""
    frame_skip: int = 4
    """emulator frames per agent step, repeated by ALE in C++"""
    window: int = 4
    """frames the agent sees at once (the current one and 3 from its memory)"""
    max_episode_steps: int | None = None
    """truncate episodes after this many agent steps (None: the whole game)"""
    net: str = "a3c"
    """the convolutional torso: a3c (16-32 filters, 256 units) or nature (32-64-64, 512)"""
    learning_rate: float = 2.5e-4
    """Adam step size (as PPO's on Atari)"""
    gamma: float = 0.99
    """discount factor"""
    ent_coef: float = 0.01
    """entropy bonus: keeps the policy exploring"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    max_grad_norm: float = 0.5
    """gradient clipping (global L2 norm)"""
    clip_rewards: bool | None = None
    """train on sign(reward) (episode returns stay raw; Atari: true)"""
    reward_scale: float | None = None
    """train on reward x this, when not clipped (episode returns stay raw; CarRacing: 0.1: values near Pong's)"""
    vtrace: bool = True
    """correct for lag with V-trace (false: plain A2C, every importance weight taken as 1)"""
    rho_bar: float = 1.0
    """clip of the importance weights in the policy gradient and the TD errors"""
    c_bar: float = 1.0
    """clip of the importance weights that carry TD errors back in time"""
    lam: float = 1.0
    """how far value targets look ahead: V-trace's lambda (1: to the session's end; 0.95: PPO's GAE)"""
    clip: float = 0.1
    """> 0: PPO's clipped surrogate (ratio to the player's policy within 1 +- clip) on V-trace's advantages"""
    normalize_advantages: bool = True
    """scale each batch's advantages to mean 0, std 1 (as PPO does)"""
    normalize_input: bool | None = None
    """scale each pixel by the running mean and std of its values in the frames trained on, clipped to +-5, as
    Sample Factory's normalize_input; the statistics travel with the params (Atari: true; CarRacing: false)"""
    batch_ticks: int = 200
    """ticks an update trains on: train_batch_size = batch_ticks / session_length sessions (train -b overrides)"""
    recent_sessions: int = 64
    """the trainer samples among the newest sessions only"""
    max_reuse: float | None = None
    """the pace: each recorded tick is trained on this many times on average (Atari: 8; CarRacing: 4)"""
    trainer_threads: int = 2
    """torch threads of a trainer on the CPU (players keep 1)"""
    bfloat16: bool = False
    """the trainer's forward and backward in bfloat16 autocast (losses, Adam, params: float32); fast on GPUs and on
    CPUs with AVX-512 BF16 or AMX, emulated and slower on others"""

    def __post_init__(self):
        """Fill the options left unset from the game's defaults: the stored options are complete."""
        for key, value in GAMES[game(self.env_id)].items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        derive_pace(self)


# Any Atari game: its own actions (ALE's minimal set) and the whole screen at 84x84, as DQN's and PPO's
# preprocessing; Pong's defaults, on which the figures of docs/examples.rst were measured, keep the field only
ATARI = dict(
    noop_max=30,
    actions="all",
    crop="0,210,0,160",
    size=84,
    clip_rewards=True,
    reward_scale=1.0,
    max_reuse=8.0,
    normalize_input=True,
)
GAMES = {
    "Atari": ATARI,
    "Pong": ATARI | dict(actions="NOOP,RIGHT,LEFT", crop="34,194,0,160", size=80),
    # CarRacing's 96x96 colour frames: the road above the dashboard (84x84), halved to 42x42 grayscale; its 5
    # discrete actions (continuous=False: nothing, left, right, gas, brake); rewards (-0.1 a frame, +1000/N a
    # tile, up to ~900 an episode) scaled, not clipped: their sign would weigh a tile as much as a frame, and
    # raw, the value loss's gradient would drown the policy's under the gradient clip
    "CarRacing": dict(
        noop_max=0,
        actions="0,1,2,3,4",
        crop="0,84,6,90",
        size=42,
        clip_rewards=False,
        reward_scale=0.1,
        max_reuse=4.0,
        normalize_input=False,
    ),
}


def game(env_id: str) -> str:
    """The entry of ``GAMES`` for a game id: its name (ALE/Pong-v5, PongNoFrameskip-v4: Pong), else Atari."""
    name = env_id.split("/")[-1].split("-")[0].removesuffix("NoFrameskip")
    return name if name in GAMES else "Atari"


def register_ale():
    """Register ALE's games with Gymnasium; ale-py is needed by the Atari games only, not the racing game."""
    try:
        import ale_py
    except ImportError:
        raise ImportError("the Atari games need ale-py: pip install -e '.[examples,atari]'", name="ale_py") from None
    gym.register_envs(ale_py)


class NoopReset(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Start each episode with 0..``noop_max`` NOOPs (action 0), drawn at random.

    A deterministic game (no sticky actions) then still starts in different
    states, so a greedy policy is evaluated on more than one game (as
    Stable-Baselines3's ``NoopResetEnv``).
    """

    def __init__(self, env: gym.Env, noop_max: int = 30):
        gym.utils.RecordConstructorArgs.__init__(self, noop_max=noop_max)
        super().__init__(env)
        self.noop_max = noop_max

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        for _ in range(self.np_random.integers(self.noop_max + 1)):
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset()
        return obs, info


class FrameMemory:
    """The window of the last ``k`` frames kept as agent memory: the previous k-1 frames.

    Players: ``window, memory = fm.push(observations, memory)`` each tick. The
    core stores the memory once per session, before tick 0, so every frame is
    stored once (a window in the observation would store each k times), and the
    trainer rebuilds every tick's window from the session (``window_indices``).
    An episode starts with zero frames, so the rebuilt window is the one played.
    """

    def __init__(self, k: int, frame_shape: tuple[int, ...]):
        assert k >= 1, "the window holds at least one frame"
        self.k, self.frame_shape = k, tuple(frame_shape)

    def initial(self, batch_size: int) -> dict[str, np.ndarray]:
        return {"frames": np.zeros((batch_size, self.k - 1, *self.frame_shape), np.uint8)}

    def push(self, observations: np.ndarray, memory: dict) -> tuple[np.ndarray, dict]:
        """(B, k, ...) windows ending with ``observations``, and the memory for the next tick."""
        window = np.concatenate([memory["frames"], np.asarray(observations)[:, None]], axis=1)
        return window, {"frames": window[:, 1:]}


class ActorCritic(nn.Module):
    """A convolutional torso with a policy head and a value head; uint8 frames in."""

    TORSOS = {  # (out channels, kernel, stride) per conv layer, then hidden units
        "a3c": ([(16, 8, 4), (32, 4, 2)], 256),
        "nature": ([(32, 8, 4), (64, 4, 2), (64, 3, 1)], 512),
    }

    def __init__(self, net: str, window: int, size: int, n_actions: int, normalize: bool = False):
        super().__init__()
        assert net in self.TORSOS, f"net {net!r}: choose one of {', '.join(self.TORSOS)}"
        convs, hidden = self.TORSOS[net]
        layers, channels = [], window
        for out, kernel, stride in convs:
            layers += [layer_init(nn.Conv2d(channels, out, kernel, stride)), nn.ReLU()]
            channels = out
        self.torso = nn.Sequential(*layers, nn.Flatten())
        n_flat = self.torso(torch.zeros(1, window, size, size)).shape[1]
        self.torso.append(layer_init(nn.Linear(n_flat, hidden)))
        self.torso.append(nn.ReLU())
        self.policy = layer_init(nn.Linear(hidden, n_actions), std=0.01)
        self.value = layer_init(nn.Linear(hidden, 1), std=1.0)
        self.normalize = normalize
        if normalize:  # a pixel's running statistics over the frames trained on, in [0, 1] units: until the first
            # update (count 0) the frames go in as x / 255, as without normalization
            self.register_buffer("pixel_mean", torch.zeros(size, size, dtype=torch.float64))
            self.register_buffer("pixel_var", torch.ones(size, size, dtype=torch.float64))
            self.register_buffer("pixel_count", torch.zeros(1, dtype=torch.float64))
        # pixels next to each other in memory (NHWC): the same numbers, and on a CPU core an update takes half
        # the time (89 -> 49 ms an update of 8 Pong sessions, 1 thread; bench/atari_learn.py --profile)
        self.to(memory_format=torch.channels_last)

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        frames = frames.contiguous(memory_format=torch.channels_last).float()  # uint8 until here
        if self.normalize:  # (x / 255 - mean) / std in one pass: a pixel that rarely changes (the ball's path
            # across a still field) stands out
            std = (self.pixel_var.float() + 1e-5).sqrt()
            frames = torch.addcmul(-self.pixel_mean.float() / std, frames, 1.0 / (255.0 * std)).clamp_(-5.0, 5.0)
        else:
            frames = frames.div_(255.0)
        hidden = self.torso(frames)
        return self.policy(hidden), self.value(hidden).squeeze(-1)

    @torch.no_grad()
    def observe(self, frames: torch.Tensor) -> None:
        """Fold (N, H, W) uint8 frames into the per-pixel running mean and variance (the parallel
        update of https://en.wikipedia.org/wiki/Algorithms_for_calculating_variance#Parallel_algorithm)."""
        x = frames.double() / 255.0
        n = x.shape[0]
        count = self.pixel_count.clone()
        total = count + n
        delta = x.mean(0) - self.pixel_mean
        moments = self.pixel_var * count + x.var(0, unbiased=False) * n + delta**2 * count * n / total
        self.pixel_var.copy_(moments / total)
        self.pixel_mean.add_(delta * n / total)
        self.pixel_count.copy_(total)


class Atari(tinyverse.Experiment):
    def __init__(self, args: Args | None = None):
        self.args = a = args or Args()
        super().__init__(a)  # the core reads its settings (the batch, the pace, the buffer) there
        env = self.make_env()
        assert isinstance(env.action_space, gym.spaces.Discrete), "only discrete actions"
        self.frames = FrameMemory(a.window, env.observation_space.shape)
        self.net = ActorCritic(a.net, a.window, a.size, int(env.action_space.n), a.normalize_input)
        env.close()
        self.device = torch.device("cpu")  # players act on the CPU; prepare_training picks the trainer's

    def make_env(self, render_mode=None):
        a = self.args
        if a.env_id.startswith("CarRacing"):  # Box2D: discrete actions, and the action repeat is ours
            from racing import FastCarRacing  # the racing game's env: only it needs Box2D

            racing = FastCarRacing(a.frame_skip, continuous=False, render_mode=render_mode)
            env = gym.wrappers.TimeLimit(racing, -(-1000 // a.frame_skip))  # CarRacing-v3's 1000 frames
        else:
            register_ale()
            env = gym.make(
                a.env_id,
                obs_type="grayscale",  # the emulator's own luminance: no NumPy work per frame
                frameskip=a.frame_skip,
                repeat_action_probability=a.sticky_actions,
                render_mode=render_mode,
            )
            # ALE says 30 fps for any frame skip: one frame per agent step at 60/skip fps plays at real speed
            env.metadata = {**env.metadata, "render_fps": 60 // a.frame_skip}
        top, bottom, left, right = (int(x) for x in a.crop.split(","))
        env = NoopReset(env, a.noop_max)
        if a.actions != "all":
            env = ActionSubset(env, [int(x) if x.strip().isdigit() else x.strip() for x in a.actions.split(",")])
        env = Preprocess(env, crop=(top, bottom, left, right), size=(a.size, a.size))
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
        logp = logits.log_softmax(1)
        if greedy:
            actions = logp.argmax(1)
        else:  # torch.multinomial: the same draw as Categorical.sample without its ~0.1 ms of checks
            actions = torch.multinomial(logp.exp(), 1)[:, 0]
        taken = logp.gather(1, actions[:, None])[:, 0]
        return actions.cpu().numpy(), memory, {"logp": taken.cpu().numpy()}

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        prepare_appo(self, self.args.learning_rate)
        torch.set_num_threads(self.args.trainer_threads)

    def sample(self, db, batch_size):
        return sample_recent(db, batch_size, self.args.recent_sessions)

    def trained(self, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The net's logits and values on the trainer, in float32 (computed in bfloat16 where that is on)."""
        with torch.autocast(self.device.type, torch.bfloat16, enabled=self.args.bfloat16):
            logits, values = self.net(windows)
        return logits.float(), values.float()

    def windows(self, batch) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Every tick's window (B, T+1, K, H, W) uint8 on the device, the frame sequence they index, and
        where each tick's final window lies in it (``wrappers.window_indices``: the frames of ``FrameMemory``)."""
        d, k = self.device, self.args.window
        idx, final_idx = window_indices(batch["terminated"], batch["truncated"], k)
        obs = torch.from_numpy(batch["observations"]).to(d)
        # every frame of the session once: [zero, memory, observations, finals]
        parts = [torch.zeros_like(obs[:, :1]), torch.from_numpy(batch["memory.frames"]).to(d), obs]
        seq = torch.cat([*parts, torch.from_numpy(batch["final_observations"]).to(d)], dim=1)
        rows = torch.arange(len(idx), device=d)[:, None, None]
        return seq[rows, torch.from_numpy(idx).to(d)], seq, final_idx

    def train_step(self, batch):
        a, d = self.args, self.device
        B, T = batch["rewards"].shape
        terminated, truncated = batch["terminated"], batch["truncated"]
        windows, seq, final_idx = self.windows(batch)
        logits, values = self.trained(windows.flatten(0, 1))
        logits, values = logits.view(B, T + 1, -1)[:, :T], values.view(B, T + 1)
        logp_all = logits.log_softmax(-1)
        actions = torch.from_numpy(batch["actions"]).to(d).long()
        logp = logp_all.gather(-1, actions[..., None])[..., 0]

        with torch.no_grad():
            next_values = values[:, 1:].clone()  # after an episode end this is the next episode's start...
            b, t = np.nonzero(truncated & ~terminated)
            if len(b):  # ...so a truncated episode bootstraps from its own final window
                final = seq[torch.from_numpy(b).to(d)[:, None], torch.from_numpy(final_idx[b, t]).to(d)]
                next_values[torch.from_numpy(b).to(d), torch.from_numpy(t).to(d)] = self.trained(final)[1]
            next_values[torch.from_numpy(terminated).to(d)] = 0.0  # and a terminated one does not
            rewards = torch.from_numpy(batch["rewards"]).to(d)
            rewards = rewards.sign() if a.clip_rewards else rewards * a.reward_scale
            ended = torch.from_numpy(terminated | truncated).to(d)
        recorded = torch.from_numpy(batch["outputs.logp"]).to(d)
        total, metrics, _ = appo_loss(logp_all, logp, recorded, values, next_values, rewards, ended, a)
        metrics["policy_lag"] = float(batch["policy_lag"].mean()) if "policy_lag" in batch else 0.0
        self.optimizer.zero_grad()
        total.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.net.parameters(), self.args.max_grad_norm)
        self.optimizer.step()
        if a.normalize_input:  # after the update, so that it trained the policy the players acted with (rho 1
            # without lag); Sample Factory's learner folds a batch in before it
            self.net.observe(torch.from_numpy(batch["observations"]).to(d).flatten(0, 1))
        return metrics | {"grad_norm": grad_norm.item()}

    # -- params -----------------------------------------------------------------
    def get_params(self):
        return get_weights({"": self.net})  # the net's own keys: stored runs' params load as they are

    def set_params(self, params):
        assert "pixel_mean" in params or not self.args.normalize_input, (
            "params without normalize_input's pixel statistics: a run stored before it was on goes on with --set"
            " normalize_input=false"
        )
        load_weights({"": self.net}, params)


def make_experiment(args: Args):
    return Atari(args)
