"""Watching training: the info dashboard, learning-curve plots, TensorBoard files."""

import time

import numpy as np

from .database import Database
from .errors import TinyverseError


def _age(seconds: float) -> str:
    s = int(seconds)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def info_text(db: Database, last: int = 100) -> str:
    """The dashboard of one namespace as text."""
    (stored, added), workers = db.count_sessions(), db.workers()
    version, saved = db.params_version(saved=True) or (None, None)
    lines, now = [f"[{db.prefix}] {db.url}"], time.time()
    if not (added or version or workers):
        return lines[0] + "\n  empty: start a player with python -m tinyverse EXP play"
    corrupt, options = db.counter("corrupt"), db.setting("options")
    lines.append(f"  sessions  {stored:,} stored of {db.capacity() or 0:,} capacity, {added:,} ever added")
    lines[-1] += f", {corrupt:,} corrupt removed" if corrupt else ""
    lines += ["  options   " + ", ".join(f"{k}={v}" for k, v in options.items())] if options else []
    lines.append("  params    " + ("none" if version is None else f"version {version}, saved {_age(now - saved)} ago"))
    pace = next((w["pace"] for w in workers if w.get("pace")), None)
    if pace and pace[0]:  # [updates_per_step, learning_starts, pace_slack, session_length]
        updates, played = db.counter("updates"), max(0, added * pace[3] - pace[1])
        lines.append(
            f"  pace      target {pace[0]:g} updates an env step (after {pace[1]:,}, slack {pace[2]:,}), "
            f"actual {f'{updates / played:.3g}' if played else '-'} ({updates:,} updates)"
        )
    for w in workers:
        player = w["role"] == "player"
        rate = f"{w.get('steps_per_s', 0):,.0f} steps/s" if player else f"{w.get('updates_per_s', 0):,.1f} updates/s"
        used = f"  params v{w['version']}" if w.get("version") is not None else ""
        used += f", lag {version - w['version']}" if used and version is not None else ""  # staleness
        used += f"  {w['pushes']:,} pushes, {w.get('conflicts', 0):,} races lost" if w.get("pushes") else ""
        used += f"  waiting {w['waiting']}" if w.get("waiting") else ""
        where = f"{w['host']} pid {w['pid']}" + (f" on {w['place']}" if w.get("place") else "")
        lines.append(f"  {w['role']:<8}  {where}  up {_age(now - w['started'])}  {rate}{used}")
    lines += [] if workers else ["  workers   none alive"]
    if returns := [m["return"] for m in db.metrics("episodes", last)]:
        r = np.array(returns)
        lines.append(f"  returns   last {len(r)}: mean {r.mean():.1f}, min {r.min():.1f}, max {r.max():.1f}")
    if train := db.metrics("train", 1):
        shown = ", ".join(
            f"{k} {v:.4g}" for k, v in train[-1].items() if k not in ("time", "version", "steps", "worker")
        )
        lines.append(f"  training  {shown} ({_age(now - train[-1]['time'])} ago)")
    return "\n".join(lines)


def plot(db: Database, path: str) -> None:
    """Draw return vs env steps, return vs wall time, and trainer loss into a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TinyverseError("plot needs matplotlib: pip install 'tinyverse[plot]'") from None
    episodes, train = db.metrics("episodes"), db.metrics("train")
    if not episodes:
        raise TinyverseError(f"no episode returns stored under prefix {db.prefix!r}: play first, or check --prefix")
    steps = np.array([m["steps"] for m in episodes])
    returns = np.array([m["return"] for m in episodes])
    seconds = np.array([m["time"] for m in episodes]) - episodes[0]["time"]
    unit = 60 if seconds[-1] > 300 else 1
    smooth = np.convolve(returns, np.ones(k := min(20, len(returns))) / k, mode="valid")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, x, label in (
        (axes[0], steps, "env steps"),
        (axes[1], seconds / unit, f"wall time ({'minutes' if unit == 60 else 'seconds'})"),
    ):
        ax.plot(x, returns, ".", alpha=0.3, label="episode")
        ax.plot(x[k - 1 :], smooth, label=f"mean of {k}")
        ax.set(xlabel=label, ylabel="return")
        ax.legend()
    if losses := [(m["updates"], m["loss"]) for m in train if "loss" in m]:
        axes[2].plot(*zip(*losses, strict=True), ".-")
        axes[2].set(
            xlabel="trainer updates", ylabel="loss", yscale="log" if min(v for _, v in losses) > 0 else "linear"
        )
    axes[2].set_title("" if losses else "no trainer loss stored")
    fig.suptitle(f"{db.prefix}: {len(returns)} episodes")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


class EventWriter:
    """Scalars for TensorBoard, written by tensorboardX (pip install 'tinyverse[tensorboard]')."""

    def __init__(self, logdir: str):
        try:
            from tensorboardX import SummaryWriter
        except ImportError:
            raise TinyverseError("--logdir needs tensorboardX: pip install 'tinyverse[tensorboard]'") from None
        self.writer = SummaryWriter(logdir)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for tag, v in values.items():
            self.writer.add_scalar(tag, v, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
