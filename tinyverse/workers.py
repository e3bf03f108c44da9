"""Workers: identity, heartbeats, waiting, warm shutdown; starting one as a process (``run``)."""

import hashlib
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil

from . import identity
from .every import Every
from .options import adopt

log = logging.getLogger(__name__)

HEARTBEAT_EVERY = 2.0  # seconds between heartbeats
HEARTBEAT_TTL = 10.0  # seconds: a worker silent this long is gone
PARENT = "TINYVERSE_PARENT_PID"  # set by run: its children stop when it is gone
PLACE = "TINYVERSE_PLACE"  # set by a launcher that knows more than the host (run --ray: the node)


class StopFlag:
    """SIGINT/SIGTERM set ``stop``, which the loop checks: finish the step, save, exit (a second
    one raises KeyboardInterrupt). Signals reach only the main thread: elsewhere, none is caught."""

    def __init__(self):
        self.stop = False
        self.previous = {}  # the handlers to restore

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self.previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.stop:
            raise KeyboardInterrupt
        name = signal.Signals(signum).name
        log.warning("got %s: finishing the current step, then stopping", name)
        self.stop = True

    def __exit__(self, *exc):
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class Worker(StopFlag):
    """A player or trainer: heartbeats with counters. As a context: registered at once, stopped
    warmly, then removed."""

    def __init__(self, db, role: str, args=None):
        super().__init__()
        self.args = args  # the options dataclass: its tunable fields follow the stored ones
        self.tunes = 0  # the count of tuned changes adopted
        me = psutil.Process()
        host = socket.gethostname()
        self.db = db
        self.id = f"{role}-{host}-{me.pid}-{uuid.uuid4().hex[:6]}"
        self.info = {"id": self.id, "role": role, "host": host, "pid": me.pid}
        self.info |= {"started": time.time(), "proc_start": me.create_time()}
        self.info["cmdline"] = digest(me)  # with proc_start it tells a reused PID apart
        self.info |= {"place": os.environ[PLACE]} if os.environ.get(PLACE) else {}
        self.parent = int(os.environ[PARENT]) if os.environ.get(PARENT, "").isdigit() else None
        self.last = 0.0  # when the last heartbeat went (monotonic)
        self.say = Every(30.0)  # what it waits for, in the log
        self.token = None  # the file that proves to clear that this process is this worker

    def __enter__(self):
        super().__enter__()
        self.token = identity.write(self.db, self.info)  # before clear can find the heartbeat
        self.beat(force=True)
        return self

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.leave()

    def beat(self, force: bool = False, waiting: str | None = None, **counters) -> bool:
        """Record ``counters`` and what this worker waits for (None: nothing), send a heartbeat if
        one is due; True, and ``stop`` set, if this worker should stop."""
        self.info.update(counters, waiting=waiting)
        if not force and time.monotonic() - self.last < HEARTBEAT_EVERY:
            return False
        self.last = time.monotonic()
        if self.db.stop_requested(self.id):
            log.warning("asked to stop through the database (clear --kill-*)")
        elif self.parent is not None and os.getppid() != self.parent:
            log.warning("the run that started this worker is gone: stopping")
        else:
            self.db.heartbeat(self.id, {**self.info, "time": time.time()}, HEARTBEAT_TTL)
            self.tunes = adopt(self.args, self.db, self.tunes)
            return False
        self.stop = True
        return True

    def idle(self, why: str) -> bool:
        """A moment of a wait for ``why``, said in the heartbeat (and in the log at most every
        30 s); False once a stop came: SIGTERM, a stop request, the run gone."""
        if self.say():
            log.info("waiting %s", why)
        self.beat(waiting=why)
        time.sleep(0.02)
        return not self.stop

    def leave(self) -> None:
        try:
            self.db.remove_worker(self.id)
        finally:
            if self.token is not None:
                self.token.unlink(missing_ok=True)


def spawn(argv: list[str], env: dict[str, str], logfile: Path) -> subprocess.Popen:
    """Start the worker ``python -m tinyverse ARGV``, its output into ``logfile``, in a session of
    its own (a terminal's Ctrl-C reaches only the ``run`` that started it)."""
    with open(logfile, "ab") as out:
        io = dict(stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        argv = [sys.executable, "-m", "tinyverse", *argv]
        return subprocess.Popen(argv, env=env, start_new_session=True, **io)


def digest(p: psutil.Process) -> str:
    """A digest of a process's command line: a --password on it stays out of the database."""
    return hashlib.sha256("\0".join(p.cmdline()).encode()).hexdigest()[:16]
