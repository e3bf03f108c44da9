"""``plot``: learning curves on the run's own clocks (env steps, active wall time, the run's
updates), so that a run stopped and continued draws on where it left off."""

import re
from pathlib import Path

import numpy as np

from .. import league
from ..database import TOOL_WAIT, connect
from ..errors import TinyverseError, install

VERSIONS = r"v[0-9]+(-v[0-9]+)?"  # a params version, or a group of them (league.pooled)
IDLE = 300.0  # seconds between two episodes past which the run was stopped, not slow: not drawn


def active_minutes(times: list[float]) -> np.ndarray:
    """The run's active wall time at each of ``times`` (Unix times of its episodes), in minutes:
    a gap of more than ``IDLE`` between two episodes (the run stopped, then continued) counts 0."""
    ordered = np.maximum.accumulate(np.asarray(times, float))  # players append out of order
    gaps = np.diff(ordered, prepend=ordered[:1])
    return np.cumsum(np.where(gaps > IDLE, 0.0, gaps)) / 60


def loss_series(train: list[dict]) -> list[tuple[float, float]]:
    """(the run's update count, loss) of each trainer report that holds a loss. A report holds the
    run's count (``run_updates``) and its process's (``updates``): for reports of before the run's
    was stored, the sum of each trainer's latest count stands for it."""
    latest, points = {}, []
    for m in train:
        if not {"loss", "updates"} <= m.keys():
            continue
        latest[m.get("worker")] = m["updates"]
        run = m.get("run_updates")
        known = type(run) is int and run >= 0  # any JSON may stand beside the typed fields
        points.append((run if known else sum(latest.values()), m["loss"]))
    return points


def rating_curve(ax, played: list[tuple[str, str, float]]) -> None:
    """Draw the Elo of each params version that played games (:mod:`tinyverse.league`), or of
    each group of versions (:func:`~tinyverse.league.pooled`, at its last), against its version,
    and the fixed opponents' as lines."""
    found = league.ratings(league.pooled(played))
    last = {r.name: int(r.name.rpartition("v")[2]) for r in found if re.fullmatch(VERSIONS, r.name)}
    versions = sorted((last[r.name], r.elo) for r in found if r.name in last)
    if versions:
        ax.plot(*zip(*versions, strict=True), ".-", label="params versions")
    for r in (r for r in found if r.name not in last):
        ax.axhline(r.elo, linestyle="--", linewidth=1, color="gray")
        ax.annotate(r.name, (0, r.elo), xycoords=("axes fraction", "data"), fontsize=8)
    ax.set(xlabel="params version", ylabel="Elo", title=f"{len(played):,} games")


def mode_plot(args):
    """Draw learning curves: return vs env steps and active wall time, loss vs the run's updates,
    and of games, the Elo of each params version."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise TinyverseError(f"plot needs matplotlib: {install('matplotlib')}") from None
    kinds = sorted(Figure().canvas.get_supported_filetypes())  # said before drawing
    if Path(args.output).suffix.lower().removeprefix(".") not in kinds:
        raise TinyverseError(f"plot -o {args.output}: want an image ending .{', .'.join(kinds)}")
    db = connect(args.url, args.prefix, TOOL_WAIT, create=False)
    if not (episodes := db.metrics("episodes")):
        fix = "play first, or check --prefix"
        raise TinyverseError(f"no episode returns stored under prefix {db.prefix!r}: {fix}")
    returns = np.array([m["return"] for m in episodes])
    k = min(20, len(episodes))  # episodes a window of the running mean
    idle = f"active wall time (min; pauses over {IDLE / 60:g} min left out)"
    curves = {"env steps": [m["steps"] for m in episodes]}
    curves[idle] = active_minutes([m["time"] for m in episodes])
    played = league.games(db.metrics("games", 20_000))
    fig = Figure(figsize=(20 if played else 15, 4), layout="tight")
    axes = fig.subplots(1, 4 if played else 3)
    for ax, (label, x) in zip(axes, curves.items(), strict=False):
        ax.plot(x, returns, ".", alpha=0.3, label="episode")
        smooth = np.convolve(returns, np.ones(k) / k, mode="valid")
        ax.plot(x[k - 1 :], smooth, label=f"mean of {k}")
        ax.set(xlabel=label, ylabel="return")
        ax.legend()
    losses = loss_series(db.metrics("train"))
    title = "" if losses else "no trainer loss stored"
    axes[2].set(xlabel="updates of the run (all trainers)", ylabel="loss", title=title)
    if losses:
        axes[2].plot(*zip(*losses, strict=True), ".-")
        axes[2].set_yscale("log" if min(v for _, v in losses) > 0 else "linear")
    if played:
        rating_curve(axes[3], played)
    fig.suptitle(f"{db.prefix}: {len(returns)} episodes")
    try:
        fig.savefig(args.output, dpi=80)
    except OSError as e:  # the folder went, or filled up, since -o was checked
        raise TinyverseError(f"cannot write {args.output} ({e}): pick another -o") from None
    print(f"wrote {args.output}")
