"""Eval: full episodes with the latest params (or a snapshot's, a version's) and the agent's best
behaviour, with video."""

import functools
import logging
import os
import time
from pathlib import Path

import numpy as np

from . import checks, readable, spaces
from .database.snapshots import LATEST
from .errors import TinyverseError, install
from .experiment import Experiment
from .files import written_whole
from .league import match_line, opponent, result
from .params import check_stored, sync_params

log = logging.getLogger(__name__)


def write_video(path: Path, frames: list[np.ndarray], fps: int = 30) -> bool:
    """Write frames as an mp4 that appears whole or not at all; False (with a hint) if imageio is
    missing."""
    try:
        import imageio.v2 as imageio
    except ImportError:
        log.warning("no video: %s (imageio and imageio-ffmpeg)", install("imageio"))
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    with written_whole(path) as part:
        imageio.mimwrite(part, frames, fps=fps, codec="libx264", macro_block_size=1)
    return True


def evaluate(exp, db, episodes=10, record=None, seed=None, version=None, quiet=False, games=None):
    """Play ``episodes`` greedy episodes with the latest params of ``db`` (None: those ``exp``
    holds, of ``version``), an mp4 of each into the folder ``record``; their returns. Prints each
    return and length, then their means (a hovering lander and a crashing one may score alike,
    never last alike) and, of games (an env naming ``info["opponent"]``), the match's score, each
    game stored in the database ``games`` if given. Ctrl-C still prints the summary."""
    say = (lambda _: None) if quiet else functools.partial(print, flush=True)
    if (version := version if db is None else sync_params(exp, db, None)) is None and not quiet:
        log.warning("no params stored: evaluating the experiment's random init")
    if record:  # frames drawn offscreen: no display, none of SDL's complaints about XDG_RUNTIME_DIR
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
    env = checks.make_env(exp, "rgb_array" if record else None)
    lengths = []  # of each episode
    matches = {}  # the games against each opponent
    if record and getattr(env, "render_mode", None) != "rgb_array":
        log.warning("this environment does not render rgb_array frames: no video")
        record = None
    try:
        for ep in range(episodes):
            first = None if seed is None else seed + ep
            total, steps, frames, versus = episode(exp, env, first, bool(record))
            lengths.append((total, steps))
            if versus is not None:
                matches.setdefault(versus, []).append(result(version, versus, total, time.time()))
                if games is not None:
                    games.add_metrics("games", matches[versus][-1:])
            name = f"episode_{ep:03d}{'' if version is None else f'_v{version}'}.mp4"
            path = Path(record or ".") / name
            fps = int(env.metadata.get("render_fps") or 30)
            video = f"  video {path}" if record and write_video(path, frames, fps) else ""
            shown = f"return {readable.number(total)}, length {steps}"
            say(f"episode {ep + 1}/{episodes}: {shown}{video}")
    except KeyboardInterrupt:
        say(f"interrupted after {len(lengths)} of {episodes} episodes")
        raise
    finally:
        env.close()
        summary(say, lengths, matches, version)
    return [total for total, _ in lengths]


def summary(say, played: list[tuple[float, int]], matches: dict, version: int | None) -> None:
    """Say the mean return and length of the ``played`` episodes, and each match's score."""
    if played:
        returns = [total for total, _ in played]
        lengths = [steps for _, steps in played]
        held = "random init: no params" if version is None else f"params v{version}"
        say(f"mean return {readable.mean(returns)} ({held})")
        shortest, longest = min(lengths), max(lengths)
        say(f"mean length {readable.spread(lengths)} steps, min {shortest}, max {longest}")
    for versus, games in matches.items():
        say(match_line(versus, [g["score"] for g in games]))


def episode(exp: Experiment, env, seed: int | None, record: bool) -> tuple:
    """A greedy episode of ``env``: its return, its length, its frames (if ``record``) and the
    opponent its last step's info names (None: not a game)."""
    obs = checks.reset(env, seed=seed)
    act = checks.Act(exp, 1, greedy=True)
    memory = checks.initial_memory(exp, 1)
    total = 0.0
    steps = 0
    frames = [env.render()] if record else []
    done = False
    info = {}
    while not done:
        one = spaces.nest(spaces.stack(env.observation_space, [obs]))  # a batch of one
        actions, memory, _ = act(one, memory)
        obs, reward, terminated, truncated, info = checks.step(env, actions[0])
        total += float(reward)
        steps += 1
        done = terminated or truncated
        frames += [env.render()] if record else []
    return total, steps, frames, opponent(info)


def chosen(db, spec: str | None) -> tuple[int, dict]:
    """The (version, params) ``spec`` names in ``db`` (:meth:`~tinyverse.Database.find_params`:
    None or latest, a snapshot's name, vN); else one line naming what it holds."""
    if (found := db.find_params(spec)) is not None:
        return found
    where = f"prefix {db.prefix} of {db.url}"
    if spec in (None, LATEST):
        raise TinyverseError(f"no params in {where}: train first, or check --prefix")
    held = ", ".join(f"{s.name} (v{s.version})" for s in db.snapshots()) or "none"
    latest = "none" if (version := db.params_version()) is None else f"v{version}"
    fix = "pass a snapshot's name, a version vN that one of them holds, or latest"
    holds = f"its snapshots: {held}; the latest params: {latest}"
    raise TinyverseError(f"no params {spec!r:.70} in {where} ({holds}): {fix}")


def put(exp: Experiment, db, found: tuple[int, dict]) -> int:
    """Load ``found``, (version, params) of ``db``, into ``exp``, checked against its own; the
    version."""
    check_stored(checks.get_params(exp), found[1], db)
    checks.call("set_params", exp.set_params, found[1])
    return found[0]


def against(exp: Experiment, spec: str | None) -> bool:
    """Set the experiment's option ``opponent`` to ``spec`` for this process only (never stored:
    the experiment's ``make_env`` reads it when called); whether one was given."""
    if spec is None:
        return False
    if not hasattr(exp.run.args, "opponent"):
        fix = "give its options dataclass a field opponent that make_env reads (examples/go.py)"
        raise TinyverseError(f"--opponent {spec}: the experiment has no option opponent: {fix}")
    exp.run.args.opponent = spec
    return True
