"""Worker identity, heartbeats and warm shutdown, shared by player and trainer."""

import logging
import os
import signal
import socket
import threading
import time
import uuid

log = logging.getLogger(__name__)

HEARTBEAT_EVERY = 2.0  # seconds between heartbeats
HEARTBEAT_TTL = 10.0  # a worker silent this long is gone


def _proc_start(pid: int) -> str | None:
    """The kernel's start time of ``pid`` (clock ticks since boot), to tell PID reuse apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else fields[19]  # a zombie has exited already


def _cmdline(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return None


class Worker:
    """A registered player or trainer: heartbeats with counters, removed on exit."""

    def __init__(self, db, role: str):
        self.db, self.role = db, role
        self.host, self.pid = socket.gethostname(), os.getpid()
        self.id = f"{role}-{self.host}-{self.pid}-{uuid.uuid4().hex[:6]}"
        self.info = {
            "id": self.id,
            "role": role,
            "host": self.host,
            "pid": self.pid,
            "proc_start": _proc_start(self.pid),
            "cmdline": _cmdline(self.pid),
            "started": time.time(),
        }
        self.last = 0.0

    def beat(self, force: bool = False, **counters) -> bool:
        """Record ``counters``, send a heartbeat if one is due; True if asked to stop."""
        self.info.update(counters)
        now = time.monotonic()
        if force or now - self.last >= HEARTBEAT_EVERY:
            self.last = now
            if self.db.stop_requested(self.id):
                log.warning("asked to stop through the database (clear --kill-*)")
                return True
            self.info["time"] = time.time()
            self.db.heartbeat(self.id, self.info, HEARTBEAT_TTL)
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


def stop_worker(db, worker: dict, timeout: float = 10.0) -> str:
    """Stop a registered worker; say what was done.

    On another machine it is asked through the database and stops at its next
    heartbeat. On this one it gets SIGTERM (warm shutdown), SIGKILL if it hangs,
    unless its PID now belongs to another process (PIDs get reused): the kernel
    start time and command line recorded at registration must still match.
    """
    pid, name = worker["pid"], f"{worker['role']} pid {worker['pid']}"
    if worker.get("host") != socket.gethostname():
        db.request_stop(worker["id"])
        return f"asked {name} on {worker.get('host')} to stop"
    db.remove_worker(worker["id"])
    same = worker.get("proc_start") is not None and _proc_start(pid) == worker["proc_start"]
    if not same or _cmdline(pid) != worker.get("cmdline"):
        return f"{name} is gone (or its PID now belongs to another process): left alone"
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if _proc_start(pid) != worker["proc_start"]:
            return f"stopped {name}"
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return f"killed {name} (it did not stop within {timeout:.0f}s)"
