"""``clear --kill-players/--kill-trainers``: stop registered workers, on this machine by signal, elsewhere by asking."""

import socket
import time

import psutil

from ..database import Database
from ..workers import HEARTBEAT_EVERY, digest


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
        same = p.create_time() == worker.get("proc_start") and digest(p) == worker.get("cmdline") and _alive(p)
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
