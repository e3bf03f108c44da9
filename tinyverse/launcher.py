"""``run``: a whole fleet on this machine in one command, supervised.

Starts players and trainers as ``python -m tinyverse`` subprocesses (exactly
what a user could start by hand), restarts one that crashes with backoff (one
that exits cleanly, e.g. stopped by ``clear``, is left stopped), shows
progress, and stops them all with a warm shutdown on Ctrl-C, after a number of
env steps, or once the recent mean return reaches a target. Children run in
sessions of their own (a terminal's Ctrl-C reaches only ``run``, which stops
them once) and stop by themselves when ``run`` dies, even by kill -9. With
``--ray`` the same supervision drives Ray tasks on a cluster's nodes instead
(``tinyverse.raycluster``).
"""

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

import numpy as np

from .database import Database
from .errors import TinyverseError
from .experiment import Experiment
from .workers import PARENT, StopFlag

log = logging.getLogger(__name__)
CRASH_WINDOW = 120.0  # crashes older than this are forgiven


def spawn_local(argv: list[str], env: dict[str, str], logfile: Path) -> subprocess.Popen:
    """Start one worker on this machine, its output appended to ``logfile``."""
    with open(logfile, "ab") as out:  # a session of its own: a terminal's Ctrl-C reaches only run
        io = dict(stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return subprocess.Popen(argv, env=env, start_new_session=True, **io)


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


def status_line(db: Database, T: int, start_steps: int, started: float) -> tuple[str, int]:
    """One line of progress, and the env steps of this run."""
    stored, added = db.count_sessions()
    steps = added * T - start_steps
    returns = [m["return"] for m in db.metrics("episodes", 20)]
    train = db.metrics("train", 1)
    rate = steps / max(time.monotonic() - started, 1e-9)
    parts = [f"env steps {steps:,} ({rate:,.0f}/s)", f"sessions {stored:,}", f"params v{db.params_version() or 0}"]
    if returns:
        parts.append(f"return {np.mean(returns):.1f} (last {len(returns)})")
    if train and "loss" in train[-1]:
        parts.append(f"loss {train[-1]['loss']:.4g}")
    return " | ".join(parts), steps


def run_fleet(
    exp: Experiment,
    db: Database,
    base_argv: list[str],
    players: int = 1,
    trainers: int = 1,
    play_args: list[str] = (),
    train_args: list[str] = (),
    max_steps: int | None = None,
    target_return: float | None = None,
    max_crashes: int = 5,
    log_every: float = 20.0,
    spawn=spawn_local,
) -> str:
    """Supervise the fleet until stopped; return why it stopped.

    ``spawn(argv, env, logfile)`` starts one worker and returns what ``subprocess.Popen``
    would (poll, terminate, wait, kill): a local process, or a Ray task (tinyverse.raycluster).
    """
    logdir = Path(tempfile.mkdtemp(prefix=f"tinyverse-{db.prefix}-"))
    roles = (("trainer", "train", train_args, trainers), ("player", "play", play_args, players))
    children = [
        Child(f"{role}-{i}", [*base_argv, mode, *args], logdir, max_crashes, i, n, spawn)
        for role, mode, args, n in roles
        for i in range(n)
    ]
    since = db.metrics("episodes", 1)
    seen_time = since[-1]["time"] if since else 0.0  # the target counts only this run's episodes
    start_steps = db.count_sessions()[1] * exp.session_length
    started, shown, reason = time.monotonic(), 0.0, "interrupted"
    tty = sys.stderr.isatty()
    log.info("starting %d players and %d trainers; their logs go to %s until they stop", players, trainers, logdir)
    with StopFlag() as flag:
        try:
            for child in children:
                child.start()
            while not flag.stop:
                time.sleep(0.5)
                for child in children:
                    child.check()
                if all(child.finished for child in children):
                    reason = "every worker exited by itself"
                    break
                line, steps = status_line(db, exp.session_length, start_steps, started)
                if tty:
                    print(f"\r{line}\033[K", end="", file=sys.stderr, flush=True)
                elif time.monotonic() - shown >= log_every:
                    log.info("%s", line)
                    shown = time.monotonic()
                fresh = [m["return"] for m in db.metrics("episodes", 20) if m["time"] > seen_time]
                if target_return is not None and len(fresh) >= 20 and np.mean(fresh) >= target_return:
                    reason = f"recent mean return {np.mean(fresh):.1f} reached the target {target_return}"
                    break  # checked first: a run that reached its target says so, even at its step limit
                if max_steps is not None and steps >= max_steps:
                    reason = f"reached {steps:,} env steps"
                    break
        except TinyverseError:
            reason = "a worker kept crashing"
            raise
        finally:
            if tty:
                print(file=sys.stderr)
            log.info("stopping the fleet (%s)", reason)
            for child in children:
                child.terminate()
            for child in children:  # trainers publish params in their warm shutdown
                child.wait()
            if reason != "a worker kept crashing":  # its output was shown; keep the logs only then
                shutil.rmtree(logdir, ignore_errors=True)
    return reason
