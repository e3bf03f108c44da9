"""Eval: full episodes with the latest params and the agent's best behaviour, with video."""

import logging
import os
from pathlib import Path

import numpy as np

from .database import Database
from .experiment import Experiment, make_env
from .params import sync_params

log = logging.getLogger(__name__)


def write_video(path: Path, frames: list[np.ndarray], fps: int = 30) -> bool:
    """Write frames as mp4 with imageio-ffmpeg; False (with a hint) if it is missing.

    The file appears whole or not at all: it is written under another name, then renamed.
    """
    try:
        import imageio.v2 as imageio
    except ImportError:
        log.warning("no video: pip install 'tinyverse[video]' (imageio and imageio-ffmpeg)")
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.stem}.part{path.suffix}")
    try:
        imageio.mimwrite(part, frames, fps=fps, codec="libx264", macro_block_size=1)
        part.replace(path)
    finally:
        part.unlink(missing_ok=True)
    return True


def evaluate(
    exp: Experiment,
    db: Database | None,
    episodes: int = 10,
    record: str | None = None,
    seed: int | None = None,
    version: int | None = None,
    quiet: bool = False,
) -> list[float]:
    """Play ``episodes`` full episodes greedily with the latest params of ``db``; write an mp4 each into ``record``.

    With ``db`` None, the params ``exp`` holds are played (``version``: theirs, or
    None for a random init). Interrupted (Ctrl-C), it still prints the summary of
    the finished episodes and leaves no partial video behind. ``quiet``: print nothing.
    """
    say = (lambda *_, **__: None) if quiet else print
    if db is not None:
        version = sync_params(exp, db, None)
    if version is None and not quiet:
        log.warning("no params stored: evaluating the experiment's random init")
    if record:  # frames are drawn offscreen: no display, and none of SDL's complaints about XDG_RUNTIME_DIR
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    env = make_env(exp, "rgb_array" if record else None)
    if record and getattr(env, "render_mode", None) != "rgb_array":
        log.warning("this environment does not render rgb_array frames: no video")
        record = None
    fps = int(env.metadata.get("render_fps") or 30)
    returns: list[float] = []
    try:
        _play(exp, env, episodes, record, seed, version, fps, returns, say)
    except KeyboardInterrupt:
        say(f"interrupted after {len(returns)} of {episodes} episodes")
        raise
    finally:
        env.close()
        if returns:
            mean, std, n = np.mean(returns), np.std(returns), len(returns)
            held = "random init: no params" if version is None else f"params v{version}"
            say(f"mean return {mean:.1f} ± {std:.1f} over {n} episodes ({held})", flush=True)
    return returns


def _play(exp, env, episodes, record, seed, version, fps, returns, say) -> None:
    for ep in range(episodes):
        obs, _ = env.reset(seed=None if seed is None else seed + ep)
        memory = exp.initial_memory(1)
        frames = [env.render()] if record else []
        total, done = 0.0, False
        while not done:
            actions, memory, *_ = exp.act(np.asarray(obs)[None], memory, greedy=True)
            obs, reward, terminated, truncated, _ = env.step(np.asarray(actions)[0])
            total += float(reward)
            done = terminated or truncated
            if record:
                frames.append(env.render())
        returns.append(total)
        video, path = "", Path(record or ".") / f"episode_{ep:03d}{'' if version is None else f'_v{version}'}.mp4"
        if record and write_video(path, frames, fps):
            video = f"  video {path}"
        say(f"episode {ep + 1}/{episodes}: return {total:.1f}{video}", flush=True)
