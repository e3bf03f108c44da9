"""``run``: a whole fleet on this machine in one command, supervised.

Starts players and trainers as ``python -m tinyverse`` subprocesses (exactly
what a user could start by hand), restarts one that crashes with backoff (one
that exits cleanly, e.g. stopped by ``clear``, is left stopped), shows
progress, and stops them all with a warm shutdown on Ctrl-C, after a number of
env steps, or once the recent mean return reaches a target. Children run in
sessions of their own (a terminal's Ctrl-C reaches only ``run``, which stops
them once) and stop by themselves when ``run`` dies, even by kill -9. With
``--ray`` the same supervision drives Ray tasks on a cluster's nodes instead
(``tinyverse.ops.ray``).
"""

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ..database import Database
from ..errors import TinyverseError
from ..workers import PARENT, StopFlag
from .monitor import progress

log = logging.getLogger(__name__)
CRASH_WINDOW = 120.0  # crashes older than this are forgiven


def spawn_local(argv: list[str], env: dict[str, str], logfile: Path) -> subprocess.Popen:
    """Start ``python -m tinyverse ARGV`` on this machine, its output appended to ``logfile``."""
    with open(logfile, "ab") as out:  # a session of its own: a terminal's Ctrl-C reaches only run
        io = dict(stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return subprocess.Popen([sys.executable, "-m", "tinyverse", *argv], env=env, start_new_session=True, **io)


class Child:
    """One supervised worker process, its log file and its crash history."""

    def __init__(self, name: str, argv: list[str], logdir: Path, max_crashes: int, index: int, count: int, spawn):
        self.name, self.argv, self.logfile, self.spawn = name, argv, logdir / f"{name}.log", spawn
        self.max_crashes, self.restart_at, self.crashes = max_crashes, 0.0, deque()
        # e.g. Ape-X: player i of n explores with its own epsilon
        self.env = {**os.environ, "TINYVERSE_WORKER_INDEX": str(index), "TINYVERSE_WORKER_COUNT": str(count)}
        self.env[PARENT] = str(os.getpid())
        self.proc: subprocess.Popen | None = None
        self.finished = False  # exited with code 0: stopped on purpose, not restarted

    def start(self) -> None:
        self.proc = self.spawn(self.argv, self.env, self.logfile)

    def tail(self, n: int = 8) -> str:
        lines = self.logfile.read_text(errors="replace").splitlines()[-n:]
        return "\n".join("    " + line for line in lines)

    def check(self) -> None:
        """Restart a crashed process with backoff; raise once it keeps crashing."""
        now = time.monotonic()
        if self.finished:
            return
        if self.proc is None:
            if now >= self.restart_at:
                log.warning("restarting %s (crash %d)", self.name, len(self.crashes))
                self.start()
            return
        code = self.proc.poll()
        if code is None:
            return
        self.proc = None
        if code == 0:
            log.warning("%s exited by itself (code 0): not restarted", self.name)
            self.finished = True
            return
        self.crashes.append(now)
        while self.crashes and now - self.crashes[0] > CRASH_WINDOW:
            self.crashes.popleft()
        if len(self.crashes) >= self.max_crashes:
            raise TinyverseError(f"{self.name} crashed {len(self.crashes)} times; its last output:\n{self.tail()}")
        delay = min(2 ** (len(self.crashes) - 1), 30)
        log.warning("%s exited with code %s; restarting in %ds. Last output:\n%s", self.name, code, delay, self.tail(4))
        self.restart_at = now + delay

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()  # SIGTERM: finish the step, publish, exit

    def wait(self, timeout: float = 30.0) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop in %.0fs: killing it", self.name, timeout)
                self.proc.kill()
                self.proc.wait()


def fleet(experiment: str, prefix: str, options: list[tuple[str, str]], players: int, trainers: int,
          play_batch: int, train_batch: int, sync: bool | None, push_coef: float = 1.0,
          ) -> list[tuple[str, list[str], int, int]]:  # fmt: skip
    """(name, argv after ``python -m tinyverse``, index, count) of each worker: what a user would type."""
    shared = ["--prefix", prefix, "-q", *(f"--set={k}={v}" for k, v in options)]
    train = [experiment, "train", "-b", str(train_batch), "--push-coef", str(push_coef), *shared]
    train += [] if sync is None else ["--sync" if sync else "--no-sync"]
    play = [experiment, "play", "-b", str(play_batch), *shared]
    return [(f"trainer-{i}", train, i, trainers) for i in range(trainers)] + [
        (f"player-{i}", play, i, players) for i in range(players)
    ]


def run_fleet(
    db: Database,
    workers: list[tuple[str, list[str], int, int]],
    session_length: int,
    max_steps: int | None = None,
    target_return: float | None = None,
    max_crashes: int = 5,
    spawn=spawn_local,
    judge: Callable[[], float] | None = None,
) -> str:
    """Start ``workers`` (from :func:`fleet`), supervise them until a stop condition, stop them; say why it stopped.

    ``spawn(argv, env, logfile)`` starts one worker and returns what ``subprocess.Popen``
    would (poll, terminate, wait, kill): a local process, or a Ray task (:mod:`tinyverse.ops.ray`).
    With ``judge`` (a greedy eval's mean return), ``target_return`` is held against it instead of
    the training episodes' mean, at most every 30 s.
    """
    logdir = Path(tempfile.mkdtemp(prefix=f"tinyverse-{db.prefix}-"))
    children = [Child(name, argv, logdir, max_crashes, i, n, spawn) for name, argv, i, n in workers]
    log.info("starting %d workers; their logs go to %s until they stop", len(children), logdir)
    watch, reason = Watch(db, session_length, max_steps, target_return, judge), None
    with StopFlag() as flag:
        try:
            for child in children:
                child.start()
            while not flag.stop and reason is None:
                time.sleep(0.5)
                for child in children:
                    child.check()
                reason = "every worker exited by itself" if all(c.finished for c in children) else watch.check()
        except TinyverseError:
            reason = "a worker kept crashing"
            raise
        finally:
            watch.close()
            reason = reason or "interrupted"
            log.info("stopping the fleet (%s)", reason)
            for child in children:
                child.terminate()
            for child in children:  # trainers publish params in their warm shutdown
                child.wait()
            if reason != "a worker kept crashing":  # its output was shown; keep the logs only then
                shutil.rmtree(logdir, ignore_errors=True)
    return reason


class Watch:
    """The run's progress line and its stop conditions, counted from the start of this run."""

    def __init__(self, db: Database, T: int, max_steps: int | None, target: float | None, judge=None, every=20.0):
        self.db, self.T, self.max_steps, self.target, self.every = db, T, max_steps, target, every
        self.judge, self.judged = judge, time.monotonic()
        last = db.metrics("episodes", 1)
        self.since = last[-1]["time"] if last else 0.0  # the target counts only this run's episodes
        self.start_steps, self.started, self.shown = db.count_sessions().added * T, time.monotonic(), 0.0
        self.tty = sys.stderr.isatty()

    def check(self) -> str | None:
        """Show progress; why the run should stop, or None."""
        steps = self.db.count_sessions().added * self.T - self.start_steps
        rate = steps / max(time.monotonic() - self.started, 1e-9)
        line = " | ".join([f"env steps {steps:,} ({rate:,.0f}/s)", *progress(self.db)])
        if self.tty:
            print(f"\r{line}\033[K", end="", file=sys.stderr, flush=True)
        elif time.monotonic() - self.shown >= self.every:
            log.info("%s", line)
            self.shown = time.monotonic()
        if self.judge is not None and self.target is not None and time.monotonic() - self.judged >= 30:
            score, self.judged = self.judge(), time.monotonic()
            log.info("greedy eval: mean return %.1f (target %g)", score, self.target)
            if score >= self.target:
                return f"greedy eval's mean return {score:.1f} reached the target {self.target}"
        fresh = self.db.recent_returns(20, self.since)
        if self.judge is None and self.target is not None and len(fresh) >= 20 and np.mean(fresh) >= self.target:
            return f"recent mean return {np.mean(fresh):.1f} reached the target {self.target}"  # before the limit
        if self.max_steps is not None and steps >= self.max_steps:
            return f"reached {steps:,} env steps"
        return None

    def close(self) -> None:
        if self.tty:
            print(file=sys.stderr)
