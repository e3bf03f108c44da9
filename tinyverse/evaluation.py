"""Eval: full episodes with the latest params and the agent's best behaviour, with video."""

import logging
from pathlib import Path

import numpy as np

from .experiment import Experiment
from .params import sync_params

log = logging.getLogger(__name__)


def write_video(path: Path, frames: list[np.ndarray], fps: int = 30) -> bool:
    """Write frames as mp4 with imageio-ffmpeg; False (with a hint) if it is missing."""
    try:
        import imageio.v2 as imageio
    except ImportError:
        log.warning("no video: pip install 'tinyverse[video]' (imageio and imageio-ffmpeg)")
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    imageio.mimwrite(path, frames, fps=fps, codec="libx264", macro_block_size=1)
    return True


def evaluate(
    exp: Experiment, db, episodes: int = 10, record: str | None = None, seed: int | None = None
) -> list[float]:
    """Play ``episodes`` full episodes greedily; write an mp4 each into ``record``."""
    version = sync_params(exp, db, None)
    if version is None:
        log.warning("no params in the database: evaluating a random init")
    env = exp.make_env(render_mode="rgb_array" if record else None)
    if record and getattr(env, "render_mode", None) != "rgb_array":
        log.warning("this environment does not render rgb_array frames: no video")
        record = None
    fps = int(env.metadata.get("render_fps") or 30)
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=None if seed is None else seed + ep)
        memory = exp.initial_memory(1)
        frames = [env.render()] if record else []
        total, done = 0.0, False
        while not done:
            actions, memory = exp.act(np.asarray(obs)[None], memory, greedy=True)
            obs, reward, terminated, truncated, _ = env.step(np.asarray(actions)[0])
            total += float(reward)
            done = terminated or truncated
            if record:
                frames.append(env.render())
        returns.append(total)
        video = ""
        if record and write_video(Path(record) / f"episode_{ep:03d}_v{version or 0}.mp4", frames, fps):
            video = f"  video {Path(record) / f'episode_{ep:03d}_v{version or 0}.mp4'}"
        print(f"episode {ep + 1}/{episodes}: return {total:.1f}{video}", flush=True)
    env.close()
    print(f"mean return {np.mean(returns):.1f} ± {np.std(returns):.1f} over {episodes} episodes (params v{version})")
    return returns
