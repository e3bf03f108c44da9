"""Workers: identity, heartbeats, warm shutdown, waiting, and the pace that players and trainers keep."""

import hashlib
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable

import psutil

from .database import Database
from .errors import ExperimentError

log = logging.getLogger(__name__)

HEARTBEAT_EVERY = 2.0  # seconds between heartbeats
HEARTBEAT_TTL = 10.0  # a worker silent this long is gone
PARENT = "TINYVERSE_PARENT_PID"  # set by run: its children stop when it is gone
PLACE = "TINYVERSE_PLACE"  # set by a launcher that knows more than the host name (run --ray: the Ray node)


class Worker:
    """A registered player or trainer: heartbeats with counters, removed on exit."""

    def __init__(self, db: Database, role: str):
        self.db, self.role = db, role
        me = psutil.Process()
        self.id = f"{role}-{socket.gethostname()}-{me.pid}-{uuid.uuid4().hex[:6]}"
        self.info = {
            "id": self.id,
            "role": role,
            "host": socket.gethostname(),
            "pid": me.pid,
            "proc_start": me.create_time(),  # with the command line's digest, tells a reused PID apart
            "cmdline": _digest(me),  # a digest: a --password on the command line stays out of the database
            "started": time.time(),
        }
        if os.environ.get(PLACE):
            self.info["place"] = os.environ[PLACE]
        self.parent = int(os.environ[PARENT]) if os.environ.get(PARENT, "").isdigit() else None
        self.last, self.said = 0.0, -30.0

    def beat(self, force: bool = False, **counters) -> bool:
        """Record ``counters``, send a heartbeat if one is due; True if this worker should stop."""
        self.info.update(counters)
        now = time.monotonic()
        if force or now - self.last >= HEARTBEAT_EVERY:
            self.last = now
            if self.db.stop_requested(self.id):
                log.warning("asked to stop through the database (clear --kill-*)")
                return True
            if self.parent is not None and os.getppid() != self.parent:
                log.warning("the run that started this worker is gone: stopping")
                return True
            self.info["time"] = time.time()
            self.db.heartbeat(self.id, self.info, HEARTBEAT_TTL)
        return False

    def wait(self, flag: "StopFlag", why: Callable[[], str | None], poll: Callable | None = None) -> bool:
        """Wait while ``why()`` names what is missing, heartbeating; False on a stop.

        What it waits for shows in its heartbeat and in the log, at most every 30 s.
        """
        while not flag.stop:
            reason = self.info["waiting"] = why()
            if reason is None:  # what ``why`` granted is used: a stop comes after this step
                return True
            if time.monotonic() - self.said >= 30:
                log.info("waiting %s", reason)
                self.said = time.monotonic()
            if self.beat():
                flag.stop = True
            if poll is not None:
                poll()
            time.sleep(0.02)
        return False

    def leave(self) -> None:
        self.db.remove_worker(self.id)


class Pace:
    """The replay ratio that the loops hold, after Reverb's SampleToInsertRatio, in env steps.

    ``lead = max(0, played - learning_starts) - updates / updates_per_step`` is how far
    players are ahead of trainers. Players wait while lead > slack; trainers wait until
    ``learning_starts`` env steps are played and while lead < -slack. Both counters live
    in the database, so any number of players and trainers can join and leave.
    Updates count in samples: one on B sessions counts ``B / train_batch_size``, so
    ``train -b 64`` makes half the updates of ``-b 32``.
    """

    def __init__(self, exp, db: Database):
        self.ratio, self.starts, self.slack = exp.updates_per_step, exp.learning_starts, exp.pace_slack
        if (self.ratio is not None and not self.ratio > 0) or self.starts < 0 or self.slack < 0:
            raise ExperimentError(
                f"bad pace: updates_per_step {self.ratio} (None or > 0), learning_starts {self.starts} and "
                f"pace_slack {self.slack} (>= 0)"
            )
        self.db, self.T, self.spec = db, exp.session_length, [self.ratio, self.starts, self.slack, exp.session_length]
        self.unit, self.size = exp.train_batch_size, 1.0  # what the last update counted: the next's guess
        self.pending, self.room = 0.0, 0.0  # updates not yet counted; updates allowed without a look

    def played(self) -> int:
        return self.db.count_sessions()[1] * self.T

    def player_waits(self) -> str | None:
        """What a player waits for before its next round, or None."""
        if self.ratio is None:
            return None
        played, updates = self.played(), self.db.counter("updates")
        if max(0, played - self.starts) - updates / self.ratio <= self.slack:
            return None
        return f"for the trainers: {updates:,} updates for {played:,} env steps, target {self.ratio:g} an env step"

    def trainer_waits(self) -> str | None:
        """What a trainer waits for before its next update, or None."""
        if self.room >= self.size:  # room known from the last look: no round trip
            return None
        played, updates = self.played(), self.flush()
        if played < self.starts:
            return f"for players: {played:,} of {self.starts:,} env steps played before learning starts"
        room = 2000 if self.ratio is None else self.ratio * (played - self.starts + self.slack) - updates - self.pending
        if room < self.size:  # the next update would overshoot the pace
            return f"for players: {updates:,} updates for {played:,} env steps, target {self.ratio:g} an env step"
        self.room = max(self.size, min(room / 2, 1000))  # look again halfway: other trainers share the room
        return None

    def count(self, sessions: int) -> None:
        """Count an update on ``sessions`` sessions."""
        self.size = sessions / self.unit
        self.pending += self.size
        self.room -= self.size

    def flush(self) -> int:
        """Count this trainer's whole updates in the database; return the total of all trainers."""
        n = int(self.pending)
        self.pending -= n
        return self.db.add_updates(n) if n else self.db.counter("updates")


class StopFlag:
    """Turns SIGINT/SIGTERM into a flag the loop checks: finish the step, save, exit.

    A second signal while stopping raises KeyboardInterrupt as usual.
    """

    def __init__(self):
        self.stop = False
        self.previous = {}

    def __enter__(self):
        if threading.current_thread() is not threading.main_thread():
            return self  # signals reach only the main thread; tests drive loops elsewhere
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.stop:
            raise KeyboardInterrupt
        log.warning("got %s: finishing the current step, then stopping", signal.Signals(signum).name)
        self.stop = True

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _digest(p: psutil.Process) -> str:
    return hashlib.sha256("\0".join(p.cmdline()).encode()).hexdigest()[:16]


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE  # a zombie has exited already
    except psutil.NoSuchProcess:
        return False


def stop_worker(db: Database, worker: dict, timeout: float = 10.0) -> str:
    """Stop a registered worker; say what was done.

    On another machine it is asked through the database and stops at its next
    heartbeat. On this one it gets SIGTERM (warm shutdown), SIGKILL if it hangs,
    unless its PID now belongs to another process (PIDs get reused): the start
    time and command line recorded at registration must still match.
    """
    name = f"{worker['role']} pid {worker['pid']}"
    if worker.get("host") != socket.gethostname():
        db.request_stop(worker["id"])
        return f"asked {name} on {worker.get('host')} to stop"
    db.remove_worker(worker["id"])
    try:
        p = psutil.Process(worker["pid"])
        same = p.create_time() == worker.get("proc_start") and _digest(p) == worker.get("cmdline") and _alive(p)
    except psutil.Error:
        same = False
    if not same:
        return f"{name} is gone (or its PID now belongs to another process): left alone"
    p.terminate()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(p):
            return f"stopped {name}"
        time.sleep(0.1)
    p.kill()
    return f"killed {name} (it did not stop within {timeout:.0f}s)"


def stop_workers(db: Database, roles: set[str]) -> list[str]:
    """Stop every registered worker of ``roles``; say what was done for each.

    Workers on other machines stop at their next heartbeat: wait a little for
    them to leave, so that a ``clear`` that follows does not race their last writes.
    """
    said = [stop_worker(db, w) for w in db.workers() if w.get("role") in roles]
    asked = {w["id"] for w in db.workers() if w.get("role") in roles and db.stop_requested(w["id"])}
    deadline = time.monotonic() + 3 * HEARTBEAT_EVERY
    while asked and time.monotonic() < deadline:
        time.sleep(0.2)
        asked &= {w["id"] for w in db.workers()}
    return said
