"""Workers: identity, heartbeats, warm shutdown (SIGINT/SIGTERM finish the step), waiting while heartbeating."""

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
from .errors import Every

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
            "cmdline": digest(me),
            "started": time.time(),
        }
        if os.environ.get(PLACE):
            self.info["place"] = os.environ[PLACE]
        self.parent = int(os.environ[PARENT]) if os.environ.get(PARENT, "").isdigit() else None
        self.last, self.say = 0.0, Every(30.0)

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
            if self.say():
                log.info("waiting %s", reason)
            if self.beat():
                flag.stop = True
            if poll is not None:
                poll()
            time.sleep(0.02)
        return False

    def leave(self) -> None:
        self.db.remove_worker(self.id)


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


def digest(p: psutil.Process) -> str:
    """A digest of a process's command line: a --password on it stays out of the database."""
    return hashlib.sha256("\0".join(p.cmdline()).encode()).hexdigest()[:16]
