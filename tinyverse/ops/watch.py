"""``run``'s progress line, its stop conditions (steps, a target on training returns or on greedy
evals) and its verdict: the params that reached the target, kept as a snapshot for the final eval
and export."""

import logging
import sys
import time
from typing import NamedTuple

import numpy as np

from .. import readable
from ..database import Database
from ..database.snapshots import VERDICT
from ..every import Every
from .bottleneck import side

log = logging.getLogger(__name__)
JUDGE_EVERY = 30.0  # seconds between two greedy evals (--target-eval)


def progress(db: Database) -> list[str]:
    """The run at a glance: sessions, params version, recent return, loss, the side that limits the
    pace (for run's progress line; ``info`` says the rates and the usual fix)."""
    parts = [f"sessions {db.count_sessions().stored:,}", f"params v{db.params_version() or 0}"]
    if returns := db.recent_returns(20):
        parts.append(f"return {readable.number(np.mean(returns))} (last {len(returns)})")
    if (train := db.metrics("train", 1)) and "loss" in train[-1]:
        parts.append(f"loss {train[-1]['loss']:.4g}")
    if limit := side(db.workers()):
        parts.append(f"bottleneck: {limit}")
    return parts


class Verdict(NamedTuple):
    """What reached the target: the params (and their version), the returns they were judged on."""

    version: int
    params: dict
    returns: list[float]
    judged: str  # on what: greedy episodes, or training episodes (of which params)
    reason: str  # why the run stops, as it says


class Watch:
    """The run's progress line and its stop conditions, counted from the start of this run.
    ``judge()``: greedy episodes of the latest params as (version, params, returns), None while
    none are stored; ``passes``: greedy evals in a row that reach the target."""

    def __init__(self, db, session_length: int, max_steps, target, judge=None, passes: int = 1):
        self.db = db
        self.T = session_length
        self.max_steps = max_steps
        self.target = target
        self.judge = judge
        self.passes = passes
        self.passed = 0  # greedy evals in a row that reached the target
        self.verdict = None  # once the target is reached
        last = db.metrics("episodes", 1)
        self.since = last[-1]["time"] if last else 0.0  # the target counts only this run's episodes
        self.steps0 = db.env_steps(self.T)  # played before this run
        self.started = time.monotonic()
        self.judged = self.started  # when the last greedy eval began
        self.tty = sys.stderr.isatty()
        self.shown = Every(20.0)  # on no tty, a line every 20 s

    @property
    def reached(self) -> bool:
        """Whether it stopped because the target was reached."""
        return self.verdict is not None

    def check(self) -> str | None:
        """Show progress; why the run should stop, or None. A target reached keeps the params
        that reached it as the snapshot :data:`~tinyverse.database.snapshots.VERDICT`."""
        steps = self.db.env_steps(self.T) - self.steps0
        now = time.monotonic()
        rate = f"env steps {steps:,} ({steps / max(now - self.started, 1e-9):,.0f}/s)"
        line = " | ".join([rate, *progress(self.db)])
        if self.tty:
            print(f"\r{line}\033[K", end="", file=sys.stderr, flush=True)
        elif self.shown():
            log.info("%s", line)
        if self.target is not None and self.judge is not None and now - self.judged >= JUDGE_EVERY:
            self.verdict = self._greedy()
        elif self.target is not None and self.judge is None:
            self.verdict = self._training()
        if self.verdict is not None:
            self.db.save_snapshot(VERDICT, self.verdict.params, self.verdict.version)
            return self.verdict.reason
        if self.max_steps is not None and steps >= self.max_steps:
            return f"reached {steps:,} env steps"
        return None

    def _greedy(self) -> Verdict | None:
        """A greedy eval of the latest params; the verdict once ``passes`` in a row reached the
        target."""
        self.judged = time.monotonic()
        if (judged := self.judge()) is None:
            return None
        version, params, returns = judged
        said = "greedy eval of params v%d: mean return %s (target %g)"
        log.info(said, version, readable.mean(returns), self.target)
        self.passed = self.passed + 1 if np.mean(returns) >= self.target else 0
        if self.passed < self.passes:
            return None
        in_a_row = f" ({self.passes} evals in a row)" if self.passes > 1 else ""
        reason = f"greedy eval's mean return {readable.mean(returns)} of params v{version}"
        reason += f" reached the target {self.target:g}{in_a_row}; kept as snapshot {VERDICT}"
        return Verdict(version, params, returns, "the greedy eval", reason)

    def _training(self) -> Verdict | None:
        """The verdict once the mean of this run's last 20 training episodes reaches the target:
        the params stored at that moment, which the final eval then plays greedily."""
        episodes = [m for m in self.db.metrics("episodes", 20) if m["time"] > self.since]
        returns = [m["return"] for m in episodes]
        if len(returns) < 20 or np.mean(returns) < self.target:
            return None
        if (found := self.db.load_params()) is None:
            return None
        versions = [m["version"] for m in episodes if m.get("version") is not None]
        played = f"params v{min(versions)} to v{max(versions)}" if versions else "params unknown"
        judged = f"training ({played}, exploring)"
        reason = f"recent mean return {readable.mean(returns)} reached the target {self.target:g}"
        reason += f" in {judged}; kept the latest params, v{found[0]}, as snapshot {VERDICT}"
        return Verdict(*found, returns, judged, reason)

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr)


def compared(verdict: Verdict, returns: list[float]) -> str:
    """The returns the verdict judged beside the final eval's of the same params; a warning when
    the two means differ by more than the larger of their spreads."""
    said = f"verdict on params v{verdict.version} (snapshot {VERDICT}): "
    said += f"{readable.mean(verdict.returns)} in {verdict.judged}; "
    said += f"{readable.mean(returns)} in the final eval"
    gap = abs(np.mean(verdict.returns) - np.mean(returns))
    if gap > max(np.std(verdict.returns), np.std(returns)):
        fix = "judge on more episodes (--target-eval N) or more evals in a row (--target-passes)"
        log.warning("the final eval differs from the verdict by more than their spread: %s", fix)
    return said
