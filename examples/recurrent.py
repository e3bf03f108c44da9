"""Memory: a recurrent (GRU) actor-critic, trained on-policy with V-trace and PPO's clip (PyTorch, one file).

    pip install -e '.[examples]'                             # Doom: '.[examples,doom,video]'
    python -m tinyverse recurrent.py run                     # CartPole seeing position and angle only
    python -m tinyverse recurrent.py run --set net=ff        # the same learner with 1 frame and no memory
    python -m tinyverse recurrent.py run --set env_id=VizdoomHealthGathering-v1   # or VizdoomDefendCenter-v1
    python -m tinyverse recurrent.py run --set env_id=VizdoomDefendCenter-v1 --set net=ff --set window=4
    python -m tinyverse recurrent.py run --set env_id=VizdoomDefendCenter-v1 --set attention=4   # soft attention
    python -m tinyverse recurrent.py eval -n 5               # greedy episodes, an mp4 each in ./records

The agent's memory is a GRU's hidden state ``h``: players keep it per environment, reset at episode
ends; the core stores it before every session's first tick (``memory.h``) and the trainer unrolls each
session from it (``unroll``), as is (``burn_in``: R2D2's burn-in, off). The learner is atari.py's
(``common.appo_loss``). CartPole sees only the cart's position and the pole's angle; ViZDoom plays at
48x80 in colour; ``flicker`` blanks frames; ``attention`` pools the map with soft spatial attention.
Design and measured results: docs/examples.rst.

R2D2: https://openreview.net/forum?id=r1lyTjAqYX. DRQN: https://arxiv.org/abs/1507.06527.
Soft attention (query from the LSTM there): https://arxiv.org/abs/1906.02500.
"""

from collections.abc import Sequence
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
    """ticks a player records per session"""
    buffer_size: int | None = 2000
    """sessions the database keeps: the trainer reads the newest recent_sessions only"""
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
    env_id: str = "CartPole-v1"
    """the Gymnasium environment: a vector game, or a ViZDoom scenario (VizdoomHealthGathering-v1, ...)"""
    keep: str | None = None
    """vector games: comma-separated observation components the agent sees (None: CartPole-v1 keeps 0,2,
    position and angle; other games all)"""
    net: str = "gru"
    """gru: a GRU's hidden state is the agent's memory; ff: feedforward, it sees only its window of frames"""
    window: int = 1
    """observations the agent sees at once (the current one and window-1 previous ones, kept as memory)"""
    hidden: int | None = None
    """units of the encoder and the GRU (None: 64 for vector games, 256 for images)"""
    burn_in: int = 0
    """R2D2's burn-in: the first ticks of each session only warm the stored state up (no gradient, no loss)"""
    actions: str | None = None
    """comma-separated action ids the agent may use (None: all; ViZDoom: 1,2,3, no no-op)"""
    frame_skip: int = 4
    """ViZDoom: game tics per agent step (the action is repeated by ViZDoom, rewards summed)"""
    crop: str = "24,120,0,160"
    """ViZDoom: top,bottom,left,right of the 160x120 screen kept (the ceiling carries nothing)"""
    size: str = "48,80"
    """ViZDoom: height,width the cropped screen is area-downscaled to"""
    grayscale: bool = False
    """ViZDoom: luminance only instead of colour"""
    attention: int = 0
    """images: heads of soft spatial attention that pool the last convolution's map (0: flatten it, as A3C does);
    eval videos draw where the heads look"""
    flicker: float = 0.0
    """probability that the agent's observation is blanked (all zeros), DRQN's flickering games: a frame window
    or a memory has to carry what a blank frame hides"""
    max_episode_steps: int | None = None
    """truncate episodes after this many agent steps (None: the game's own limit)"""
    reward_scale: float | None = None
    """rewards are multiplied by this for training (None: CartPole 0.1, VizdoomHealthGathering 0.01, else 1)"""
    learning_rate: float = 1e-3
    """Adam step size"""
    gamma: float = 0.99
    """discount factor"""
    lam: float = 0.95
    """V-trace's lambda: how far value targets look ahead (1: to the session's end)"""
    ent_coef: float = 0.01
    """entropy bonus"""
    vf_coef: float = 0.5
    """weight of the value loss"""
    max_grad_norm: float = 0.5
    """gradient clipping (global L2 norm)"""
    clip: float = 0.2
    """> 0: PPO's clipped surrogate (ratio to the player's policy within 1 +- clip); 0: IMPALA's policy gradient"""
    vtrace: bool = True
    """correct for lag with V-trace (false, with clip 0: plain A2C, every importance weight taken as 1)"""
    normalize_advantages: bool = True
    """scale each batch's advantages to mean 0, std 1 (as PPO does)"""
    rho_bar: float = 1.0
    """clip of V-trace's importance weights in the TD errors"""
    c_bar: float = 1.0
    """clip of V-trace's importance weights that carry TD errors back in time"""
    batch_ticks: int = 400
    """ticks an update trains on: train_batch_size = batch_ticks / session_length sessions (train -b overrides)"""
    recent_sessions: int = 64
    """the trainer samples among the newest sessions only"""
    max_reuse: float = 8.0
    """the pace: each recorded tick is trained on this many times on average"""

    def __post_init__(self):
        doom = self.env_id.startswith("Vizdoom")
        if self.keep is None and self.env_id == "CartPole-v1":
            self.keep = "0,2"
        if self.actions is None and doom:
            self.actions = "1,2,3"
        if self.hidden is None:
            self.hidden = 256 if doom else 64
        if self.reward_scale is None:
            presets = {"CartPole": 0.1, "VizdoomHealthGathering": 0.01}
            self.reward_scale = next((v for k, v in presets.items() if self.env_id.startswith(k)), 1.0)
        assert self.net in ("gru", "ff"), f"net {self.net!r}: gru or ff"
        assert self.window >= 1 and 0 <= self.burn_in < self.session_length and self.attention >= 0
        derive_pace(self)


# -- the games: masked CartPole, flickering frames, ViZDoom ----------------------------------------------------
class ObservationSubset(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Observe only some components of a vector observation, e.g. CartPole's position and angle (``[0, 2]``).

    Masking CartPole's velocities makes it a partially observed game: one
    observation no longer tells where the pole is going, a memory of the
    previous ones does.
    """

    def __init__(self, env: gym.Env, keep: Sequence[int]):
        gym.utils.RecordConstructorArgs.__init__(self, keep=keep)
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box) and len(space.shape) == 1, "only vector observations"
        self.keep = np.array(keep, dtype=np.int64)
        assert len(self.keep) and all(0 <= i < space.shape[0] for i in self.keep), f"keep {keep} out of {space}"
        self.observation_space = gym.spaces.Box(space.low[self.keep], space.high[self.keep], dtype=space.dtype)

    def observation(self, obs: np.ndarray) -> np.ndarray:
        return np.asarray(obs)[self.keep]


class Flicker(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Blank each observation (all zeros) with probability ``p``: DRQN's flickering games.

    Hausknecht and Stone (2015, https://arxiv.org/abs/1507.06527) made Atari
    partially observed this way: on a blank frame an agent without memory sees
    nothing at all, one with memory still knows what the last frames showed.
    Seeded by ``reset(seed=...)``, like the environment it wraps.
    """

    def __init__(self, env: gym.Env, p: float):
        gym.utils.RecordConstructorArgs.__init__(self, p=p)
        super().__init__(env)
        assert 0.0 <= p <= 1.0, f"flicker probability {p} is not in [0, 1]"
        self.p, self.rng = p, np.random.default_rng()

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        return super().reset(seed=seed, options=options)

    def observation(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros_like(obs) if self.rng.random() < self.p else obs


class DoomScreen(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """ViZDoom's Gymnasium environments as a plain image game: the screen only, and timeouts as truncations.

    ViZDoom observes a dict (``screen`` (H, W, 3) uint8, ``gamevariables``);
    this keeps the screen, which ``Preprocess`` then crops and downscales like
    any frame. At the scenario's timeout ViZDoom reports ``terminated`` and
    ``truncated`` both: the episode was cut, not lost, so this reports it
    truncated only (a learner then bootstraps from its last frame), unless the
    player died on that very step. The frame after the episode's end is black
    in ViZDoom (there is no state); ``render_fps`` is per agent step, so a
    video of a run with ``frame_skip`` plays at the game's speed.
    """

    def __init__(self, env: gym.Env):
        gym.utils.RecordConstructorArgs.__init__(self)
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Dict) and "screen" in space.spaces, "a ViZDoom env observes a screen"
        self.observation_space = space["screen"]
        skip = getattr(env.unwrapped, "frame_skip", 1)
        self.metadata = {**env.metadata, "render_fps": max(1, round(env.metadata.get("render_fps", 35) / skip))}

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        return obs["screen"], info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        if truncated and terminated:
            terminated = bool(self.env.unwrapped.game.is_player_dead())
        return obs["screen"], reward, terminated, truncated, info


class SpatialAttention(nn.Module):
    """Soft attention pooling of a (N, C, H, W) map: each head's weights sum to 1 over the H x W places.

    A 1x1 convolution scores every place per head (a learned query against the
    place's features); each head returns the weighted mean of the features and
    of two coordinate channels (so it can tell where it looked): (N, heads x
    (C + 2)). ``weights`` keeps the last call's without a gradient (N, heads, H, W), for drawing.
    """

    def __init__(self, channels: int, heads: int, height: int, width: int):
        super().__init__()
        ys, xs = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width), indexing="ij")
        self.register_buffer("coords", torch.stack([ys, xs])[None], persistent=False)  # not a param
        self.score = layer_init(nn.Conv2d(channels, heads, 1), std=0.01)  # near-uniform weights at first
        self.weights: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights = self.score(x).flatten(2).softmax(-1)  # (N, heads, H*W)
        values = torch.cat([x, self.coords.expand(len(x), -1, -1, -1)], 1).flatten(2)  # (N, C+2, H*W)
        if not torch.is_grad_enabled():  # acting (eval, players), not training: keep them for drawing
            self.weights = weights.unflatten(2, x.shape[2:])
        return torch.einsum("nkp,ncp->nkc", weights, values).flatten(1)


class Agent(nn.Module):
    """An encoder of the window of observations, a GRU cell (``net`` gru) and policy and value heads.

    Vector observations go through one dense layer; images (uint8, (H, W) or
    (H, W, C)) through the A3C paper's two convolutions, pooled by ``attention``
    heads (``SpatialAttention``) or flattened, and a dense layer.
    """

    def __init__(self, obs_shape: tuple[int, ...], window: int, n_actions: int, net: str, hidden: int, attention=0):
        super().__init__()
        self.image, self.attention = len(obs_shape) >= 2, None
        assert self.image or not attention, "attention pools an image's map: only for image games"
        if self.image:
            channels = window * (obs_shape[2] if len(obs_shape) == 3 else 1)
            convs = [layer_init(nn.Conv2d(channels, 16, 8, 4)), nn.ReLU(), layer_init(nn.Conv2d(16, 32, 4, 2))]
            self.encoder = nn.Sequential(*convs, nn.ReLU())
            grid = self.encoder(torch.zeros(1, channels, *obs_shape[:2])).shape[2:]
            self.attention = SpatialAttention(32, attention, *grid) if attention else None
            self.encoder.append(self.attention or nn.Flatten())
            n_flat = self.encoder(torch.zeros(1, channels, *obs_shape[:2])).shape[1]
        else:
            self.encoder, n_flat = nn.Sequential(nn.Flatten()), window * int(np.prod(obs_shape))
        self.encoder.append(layer_init(nn.Linear(n_flat, hidden)))
        self.encoder.append(nn.ReLU())
        self.core = nn.GRUCell(hidden, hidden) if net == "gru" else None
        self.policy = layer_init(nn.Linear(hidden, n_actions), std=0.01)
        self.value = layer_init(nn.Linear(hidden, 1), std=1.0)

    def encode(self, windows: torch.Tensor) -> torch.Tensor:
        """(N, K, *obs_shape) windows -> (N, hidden) features."""
        if self.image:
            x = windows.float() / 255.0
            if x.dim() == 5:  # (N, K, H, W, C) -> (N, K*C, H, W)
                x = x.permute(0, 1, 4, 2, 3).flatten(1, 2)
            return self.encoder(x)
        return self.encoder(windows.float())

    def step(self, features: torch.Tensor, h: torch.Tensor | None) -> torch.Tensor:
        """The state after one tick: the GRU's new hidden state, or the features themselves (feedforward)."""
        return features if self.core is None else self.core(features, h)

    def heads(self, state: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(state), self.value(state).squeeze(-1)


class AttentionVideo(gym.Wrapper):
    """Eval videos of an attention agent: ``render`` tints the screen red where the heads looked (their mean).

    The weights are those of the agent's last ``act``, on the observation before
    the step the frame shows: one agent step behind. Each place of the map is
    drawn over the part of the ``crop`` (top, bottom, left, right) it tiles.
    """

    def __init__(self, env: gym.Env, attention: SpatialAttention, crop: tuple[int, int, int, int]):
        super().__init__(env)
        self.attention, self.crop = attention, crop

    def render(self):
        frame = self.env.render()
        if frame is None or self.attention.weights is None:
            return frame
        top, bottom, left, right = self.crop
        bottom, right = min(bottom, frame.shape[0]), min(right, frame.shape[1])
        w = self.attention.weights[0].mean(0).numpy()  # (h, w) of the eval's one environment
        w = w / max(float(w.max()), 1e-8)
        rows = np.minimum(np.arange(bottom - top) * w.shape[0] // (bottom - top), w.shape[0] - 1)
        cols = np.minimum(np.arange(right - left) * w.shape[1] // (right - left), w.shape[1] - 1)
        heat = w[rows][:, cols, None] * np.array([0.6, -0.3, -0.3])  # redder where the heads look
        frame = frame.astype(np.float32)
        frame[top:bottom, left:right] = np.clip(frame[top:bottom, left:right] * (1 + heat) + 90 * heat, 0, 255)
        return frame.astype(np.uint8)


def unroll(step, features: torch.Tensor, h0: torch.Tensor, ended: torch.Tensor, burn_in: int = 0) -> torch.Tensor:
    """The states after every tick of B sessions, (B, T+1, H), as the players computed them.

    ``features`` (B, T+1, H): the encoded window of each tick 0..T; ``h0``
    (B, H): the stored state before tick 0; ``ended`` (B, T): an episode ended
    at tick t, so the state is reset to zeros before tick t+1, as a player
    resets its memory to ``initial_memory``. ``step(features, h)`` is one tick
    (``Agent.step``). With ``burn_in`` K the first K ticks run without a
    gradient, so the state that leaves them is a constant (R2D2's burn-in).
    """
    keep = (~ended).to(features.dtype)[..., None]
    h, states = h0, []
    for t in range(features.shape[1]):
        if t:
            h = h * keep[:, t - 1]
        with torch.set_grad_enabled(torch.is_grad_enabled() and t >= burn_in):
            h = step(features[:, t], h)
        states.append(h)
    return torch.stack(states, 1)


class Recurrent(tinyverse.Experiment):
    def __init__(self, args: Args | None = None):
        self.args = a = args or Args()
        super().__init__(a)  # the core reads its settings (the batch, the pace, the buffer) there
        env = self.make_env()
        assert isinstance(env.action_space, gym.spaces.Discrete), "only discrete actions"
        self.obs_space = env.observation_space
        self.net = Agent(self.obs_space.shape, a.window, int(env.action_space.n), a.net, a.hidden, a.attention)
        env.close()
        self.device = torch.device("cpu")  # players act on the CPU; prepare_training picks the trainer's

    def make_env(self, render_mode=None):
        a = self.args
        if a.env_id.startswith("Vizdoom"):
            try:
                from vizdoom import gymnasium_wrapper  # noqa: F401  (registers the Vizdoom* ids)
            except ImportError:
                hint = "the Doom games need vizdoom: pip install -e '.[examples,doom]'"
                raise ImportError(hint, name="vizdoom") from None

            env = gym.make(a.env_id, frame_skip=a.frame_skip, render_mode=render_mode, screen_resolution="RES_160X120")
            top, bottom, left, right = (int(x) for x in a.crop.split(","))
            size = tuple(int(x) for x in a.size.split(","))
            env = Preprocess(DoomScreen(env), (top, bottom, left, right), size, a.grayscale)
            if a.attention and render_mode == "rgb_array":
                env = AttentionVideo(env, self.net.attention, (top, bottom, left, right))
        else:
            env = gym.make(a.env_id, render_mode=render_mode)
            if a.keep and a.keep != "all":
                env = ObservationSubset(env, [int(x) for x in a.keep.split(",")])
        if a.flicker:
            env = Flicker(env, a.flicker)
        if a.actions:
            env = ActionSubset(env, [int(x) for x in a.actions.split(",")])
        if a.max_episode_steps:
            env = gym.wrappers.TimeLimit(env, a.max_episode_steps)
        return env

    # -- players ----------------------------------------------------------------
    def initial_memory(self, batch_size):
        a, space = self.args, self.obs_space
        memory = {}
        if a.window > 1:  # the previous window-1 observations, zeros before the episode's first
            memory["frames"] = np.zeros((batch_size, a.window - 1, *space.shape), space.dtype)
        if a.net == "gru":
            memory["h"] = np.zeros((batch_size, a.hidden), np.float32)
        return memory

    @torch.no_grad()
    def act(self, observations, memory, greedy=False):
        window = np.asarray(observations)[:, None]
        if "frames" in memory:
            window = np.concatenate([memory["frames"], window], axis=1)
        h = torch.from_numpy(memory["h"]) if "h" in memory else None
        state = self.net.step(self.net.encode(torch.from_numpy(window)), h)
        logp = self.net.heads(state)[0].log_softmax(1)
        actions = logp.argmax(1) if greedy else torch.multinomial(logp.exp(), 1)[:, 0]
        new = {"frames": window[:, 1:]} if "frames" in memory else {}
        if h is not None:
            new["h"] = state.numpy()
        return actions.numpy(), new, {"logp": logp.gather(1, actions[:, None])[:, 0].numpy()}

    # -- trainer ----------------------------------------------------------------
    def prepare_training(self):
        prepare_appo(self, self.args.learning_rate)

    def sample(self, db, batch_size):
        return sample_recent(db, batch_size, self.args.recent_sessions)

    def forward(self, batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Logits (B, T+1, A) and values (B, T+1) of every tick, unrolled from the stored state; the value
        (B, T) of what followed each tick: V(x_t+1), the final observation's where an episode was truncated,
        0 where it terminated; and the states (B, T+1, H) the heads read (the GRU's, or the features)."""
        d, k = self.device, self.args.window
        terminated, truncated = batch["terminated"], batch["truncated"]
        B, T = terminated.shape
        idx, final_idx = window_indices(terminated, truncated, k)
        obs = torch.from_numpy(batch["observations"]).to(d)
        frames = batch.get("memory.frames", np.zeros((B, 0, *obs.shape[2:]), batch["observations"].dtype))
        seq = [torch.zeros_like(obs[:, :1]), torch.from_numpy(frames).to(d), obs]
        seq = torch.cat([*seq, torch.from_numpy(batch["final_observations"]).to(d)], dim=1)
        rows = torch.arange(B, device=d)[:, None, None]
        features = self.net.encode(seq[rows, torch.from_numpy(idx).to(d)].flatten(0, 1)).view(B, T + 1, -1)
        ended = torch.from_numpy(terminated | truncated).to(d)
        if self.net.core is None:
            states = features
        else:
            h0 = torch.from_numpy(batch["memory.h"]).to(d)
            states = unroll(self.net.step, features, h0, ended, self.args.burn_in)
        logits, values = self.net.heads(states)
        with torch.no_grad():
            next_values = values[:, 1:].clone()  # after an episode end this is the next episode's start...
            b, t = np.nonzero(truncated & ~terminated)
            if len(b):  # ...so a truncated episode bootstraps from one more tick on its final observation
                bt = torch.from_numpy(b).to(d), torch.from_numpy(t).to(d)
                final = self.net.encode(seq[bt[0][:, None], torch.from_numpy(final_idx[b, t]).to(d)])
                next_values[bt] = self.net.heads(self.net.step(final, states[bt]))[1]
            next_values[torch.from_numpy(terminated).to(d)] = 0.0  # and a terminated one does not
        return logits, values, next_values, states

    def train_step(self, batch):
        a, d = self.args, self.device
        T, k = batch["rewards"].shape[1], a.burn_in
        logits, values, next_values, _ = self.forward(batch)
        logp_all = logits[:, :T].log_softmax(-1)
        actions = torch.from_numpy(batch["actions"]).to(d).long()
        logp = logp_all.gather(-1, actions[..., None])[..., 0]
        recorded = torch.from_numpy(batch["outputs.logp"]).to(d)
        with torch.no_grad():
            rewards = torch.from_numpy(batch["rewards"]).to(d) * a.reward_scale
            ended = torch.from_numpy(batch["terminated"] | batch["truncated"]).to(d)
        total, metrics, ratios = appo_loss(logp_all, logp, recorded, values, next_values, rewards, ended, a, skip=k)
        self.optimizer.zero_grad()
        total.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.net.parameters(), a.max_grad_norm)
        self.optimizer.step()
        return {
            **metrics,
            "grad_norm": grad_norm.item(),
            # the first tick's ratio against the rest: how much a stale stored state adds to the lag
            "rho_dev_first": (ratios[:, 0] - 1).abs().mean().item(),
            "rho_dev_rest": (ratios[:, 1:] - 1).abs().mean().item(),
            "policy_lag": float(batch["policy_lag"].mean()) if "policy_lag" in batch else 0.0,
        }

    # -- params -----------------------------------------------------------------
    def get_params(self):
        return get_weights({"": self.net})  # the net's own keys: stored runs' params load as they are

    def set_params(self, params):
        load_weights({"": self.net}, params)


def make_experiment(args: Args):
    return Recurrent(args)
