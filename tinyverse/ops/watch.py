"""``run``'s progress line and its stop conditions (steps, a target on training returns or on greedy
evals)."""

import logging
import sys
import time

import numpy as np

from .. import readable
from ..database import Database
from ..every import Every
from .bottleneck import side

log = logging.getLogger(__name__)


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


class Watch:
    """The run's progress line and its stop conditions, counted from the start of this run."""

    def __init__(
        self, db, session_length: int, max_steps: int | None, target: float | None, judge=None
    ):
        self.db, self.T, self.max_steps, self.target, self.judge = (
            db,
            session_length,
            max_steps,
            target,
            judge,
        )
        last = db.metrics("episodes", 1)
        self.since = last[-1]["time"] if last else 0.0  # the target counts only this run's episodes
        self.steps0 = db.env_steps(self.T)  # played before this run
        self.started = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.judged, self.shown = (
            self.started,
            Every(20.0),
        )  # a greedy eval every 30 s; on no tty, a line every 20 s
        self.reached = False  # whether it stopped because the target was reached

    def check(self) -> str | None:
        """Show progress; why the run should stop, or None."""
        steps = self.db.env_steps(self.T) - self.steps0
        now = time.monotonic()
        line = " | ".join(
            [
                f"env steps {steps:,} ({steps / max(now - self.started, 1e-9):,.0f}/s)",
                *progress(self.db),
            ]
        )
        if self.tty:
            print(f"\r{line}\033[K", end="", file=sys.stderr, flush=True)
        elif self.shown():
            log.info("%s", line)
        if self.target is not None and (reached := self._reached(now)):
            self.reached = True
            return reached
        if self.max_steps is not None and steps >= self.max_steps:
            return f"reached {steps:,} env steps"
        return None

    def _reached(self, now: float) -> str | None:
        """Why the target counts as reached (the mean judged, its spread and count), or None."""
        if self.judge:  # greedy episodes of the latest params, every 30 s
            if now - self.judged < 30:
                return None
            returns, self.judged = self.judge(), time.monotonic()  # when it was judged last
            what = "greedy eval's mean return"
            log.info("greedy eval: mean return %s (target %g)", readable.mean(returns), self.target)
        else:  # this run's training episodes
            returns = self.db.recent_returns(20, self.since)
            what = "recent mean return"
            if len(returns) < 20:
                return None
        if np.mean(returns) < self.target:
            return None
        return f"{what} {readable.mean(returns)} reached the target {self.target:g}"

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr)
