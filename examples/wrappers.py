"""Make an image game RL-friendly: small grayscale frames, few actions, and the window of frames a trainer rebuilds.

Gymnasium wrappers in pure NumPy (no OpenCV), and one index helper, shared by atari.py and recurrent.py::

    env = gym.make("ALE/Pong-v5", obs_type="grayscale", frameskip=4)
    env = ActionSubset(env, ["NOOP", "RIGHT", "LEFT"])    # Discrete(3): stay, up, down
    env = Preprocess(env, crop=(34, 194, 0, 160), size=(80, 80))  # uint8 (80, 80) grayscale

An agent that sees the last K frames keeps the previous K-1 as its *memory*,
which the core stores once per session, before tick 0: every frame is stored
once, and the trainer rebuilds every tick's window from that memory and the
session's observations (``window_indices``).
"""

from collections.abc import Sequence

import gymnasium as gym
import numpy as np


class Preprocess(gym.ObservationWrapper, gym.utils.RecordConstructorArgs):
    """Crop, grayscale and downscale image observations to uint8.

    ``crop`` is (top, bottom, left, right) in pixels (Python slice bounds);
    ``size`` is the (height, width) after an area downscale (each output
    pixel is the mean of the input pixels it covers; no upscaling); with
    ``grayscale`` an RGB frame becomes (H, W) luminance (ITU-R 601 weights).
    A frame that is already (H, W), e.g. ALE's ``obs_type="grayscale"``,
    is only cropped and resized.
    """

    def __init__(
        self,
        env: gym.Env,
        crop: tuple[int, int, int, int] | None = None,
        size: tuple[int, int] | None = (84, 84),
        grayscale: bool = True,
    ):
        gym.utils.RecordConstructorArgs.__init__(self, crop=crop, size=size, grayscale=grayscale)
        super().__init__(env)
        space = env.observation_space
        assert isinstance(space, gym.spaces.Box) and space.dtype == np.uint8, "only uint8 image observations"
        assert len(space.shape) in (2, 3), f"only (H, W) or (H, W, C) images, not {space.shape}"
        crop = crop or (None, None, None, None)
        self.crop = (slice(crop[0], crop[1]), slice(crop[2], crop[3]))
        h, w = len(range(space.shape[0])[self.crop[0]]), len(range(space.shape[1])[self.crop[1]])
        self.grayscale = grayscale and len(space.shape) == 3
        channels = space.shape[2:] if len(space.shape) == 3 and not self.grayscale else ()
        H, W = self.size = tuple(size) if size else (h, w)
        assert 0 < H <= h and 0 < W <= w, f"size {self.size} must fit in the cropped {(h, w)} (downscale only)"
        # Integer factors (160 -> 80) sum blocks of pixels with strided adds in uint16, the fast path; other
        # sizes (210 -> 84) sum each output pixel's few input pixels by their area weights (exact area
        # resampling, like cv2.INTER_AREA), in element-wise NumPy: a matrix product went through BLAS, whose
        # threads took 2-6 ms a frame on a busy 2-core machine, 10x the emulator's step (0.1 ms in one thread)
        self.block = (h // H, w // W) if h % H == 0 and w % W == 0 else None
        tail = (1,) * len(channels)  # the weights broadcast over a colour axis, shaped once here
        self.rows = [(i, weight.reshape(-1, 1, *tail)) for i, weight in _area_taps(H, h)]
        self.cols = [(i, weight.reshape(1, -1, *tail)) for i, weight in _area_taps(W, w)]
        self.observation_space = gym.spaces.Box(0, 255, (H, W, *channels), np.uint8)

    def observation(self, frame: np.ndarray) -> np.ndarray:
        frame = frame[self.crop]
        if self.grayscale:
            frame = frame.astype(np.float32) @ np.array([0.299, 0.587, 0.114], np.float32)
        if self.block == (1, 1):
            return frame.astype(np.uint8) if frame.dtype == np.uint8 else (frame + 0.5).astype(np.uint8)
        if self.block:
            fy, fx = self.block
            frame = frame.astype(np.uint16) if frame.dtype == np.uint8 else frame
            rows = sum(frame[i::fy] for i in range(fy))
            total = sum(rows[:, j::fx] for j in range(fx))
            return (total / (fy * fx) + 0.5).astype(np.uint8)
        frame = frame.astype(np.float32, copy=False)
        out = sum(frame[index] * weight for index, weight in self.rows)  # (H, w, ...)
        out = sum(out[:, index] * weight for index, weight in self.cols)  # (H, W, ...)
        return (out + 0.5).astype(np.uint8)


def _area_taps(n_out: int, n_in: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Output pixel i is the mean of the input span it covers (fractional at the edges): the sum over the
    taps k of ``weight_k[i] x input[index_k[i]]``, k up to the most input pixels one output pixel touches."""
    edges = np.arange(n_out + 1) * n_in / n_out
    lo, hi = edges[:-1, None], edges[1:, None]
    pixel = np.arange(n_in)[None, :]
    overlap = np.clip(np.minimum(hi, pixel + 1) - np.maximum(lo, pixel), 0, None)
    weights = (overlap / overlap.sum(1, keepdims=True)).astype(np.float32)  # (n_out, n_in), a band
    first, rows = (weights > 0).argmax(1), np.arange(n_out)
    taps = []
    for k in range((weights > 0).sum(1).max()):
        index = first + k
        inside = index < n_in  # past the last pixel: weight 0 (its index is clipped only to stay valid)
        index = np.minimum(index, n_in - 1)
        taps.append((index, np.where(inside, weights[rows, index], 0).astype(np.float32)))
    return taps


class ActionSubset(gym.ActionWrapper, gym.utils.RecordConstructorArgs):
    """Expose only some of the game's actions, as ``Discrete(len(actions))``.

    ``actions`` are action ids of the wrapped env, or names looked up in the
    game's ``get_action_meanings()`` (ALE), e.g. ``["NOOP", "RIGHT", "LEFT"]``.
    """

    def __init__(self, env: gym.Env, actions: Sequence[int | str]):
        gym.utils.RecordConstructorArgs.__init__(self, actions=actions)
        super().__init__(env)
        assert isinstance(env.action_space, gym.spaces.Discrete), "only discrete actions"
        meanings = getattr(env.unwrapped, "get_action_meanings", lambda: [])()
        ids = []
        for a in actions:
            if isinstance(a, str):
                assert a in meanings, f"{a!r} is not one of this game's actions {meanings}"
                a = meanings.index(a)
            assert 0 <= a < env.action_space.n, f"action {a} is not in {env.action_space}"
            ids.append(int(a))
        self.ids = np.array(ids)
        self.action_space = gym.spaces.Discrete(len(ids))

    def action(self, action) -> int:
        return int(self.ids[int(action)])


def window_indices(terminated: np.ndarray, truncated: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Where to gather every tick's window of ``k`` frames from a batch of sessions.

    Index into the frame sequence ``[zero frame, memory (k-1), observations
    (T+1), final_observations (T)]`` of each session (axis 1), e.g.
    ``seq[arange(B)[:, None, None], idx]``. Returns

    - ``idx`` (B, T+1, k): the window the agent saw at each tick t = 0..T;
    - ``final`` (B, T, k): the window of the last observation of an episode
      that ended at tick t (``final_observations[:, t]``), to bootstrap from.

    Frames from before the start of a tick's episode point at the zero frame,
    as a player's memory holds zero frames at its episode's start.
    """
    ended = np.asarray(terminated) | np.asarray(truncated)
    B, T = ended.shape
    ticks = np.arange(T + 1)
    # first tick of the episode that tick t is in (-k: it started before the session, memory is valid)
    starts = np.where(ended, ticks[None, 1:], -k)
    start = np.maximum.accumulate(np.concatenate([np.full((B, 1), -k), starts], axis=1), axis=1)  # (B, T+1)
    frame = ticks[None, :, None] - (k - 1) + np.arange(k)[None, None, :]  # observation index per slot
    idx = np.where(frame >= start[:, :, None], frame + k, 0)  # observation j is at position k + j
    # the final window of tick t: the window of tick t+1 within tick t's episode, ending with final[t]
    final = np.where(frame[:, 1:] >= start[:, :-1, None], frame[:, 1:] + k, 0)
    final[:, :, -1] = k + T + 1 + np.arange(T)
    return idx, final
