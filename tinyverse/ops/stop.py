"""``clear``: delete a namespace's data; stop its workers, here by signal, elsewhere by asking
through the database."""

import socket
import time

import psutil

from ..database import masked
from ..errors import TinyverseError
from ..identity import vouched
from ..workers import HEARTBEAT_EVERY
from .monitor import namespaces


def mode_clear(args):
    """Stop workers and/or delete sessions, params and metrics (--all: everything)."""
    roles = {role for role in ("player", "trainer") if args.all or getattr(args, f"kill_{role}s")}
    data = ("sessions", "params", "metrics")
    what = {name: args.all or getattr(args, f"del_{name}") for name in data}
    if not (roles or any(what.values())):
        flags = "--all, --del-{sessions,params,metrics} or --kill-{players,trainers}"
        raise TinyverseError(f"say what to clear: {flags}")
    if not (dbs := namespaces(args)):
        print(f"nothing to clear: no experiments in {masked(args.url)}")
    for db in dbs:
        stopping = [w for w in db.workers() if w.get("role") in roles]
        for w in stopping:
            print(f"{db.prefix}: {stop_worker(db, w)}")
        asked = {w["id"] for w in stopping if db.stop_requested(w["id"])}
        deadline = time.monotonic() + 3 * HEARTBEAT_EVERY
        while asked & {w["id"] for w in db.workers()} and time.monotonic() < deadline:
            time.sleep(0.2)  # they stop at their next heartbeat: clear must not race their writes
        db.clear(**what, workers=args.all)
        print(f"{db.prefix}: cleared {', '.join(k for k, on in what.items() if on) or 'no data'}")


def stop_worker(db, worker: dict, timeout: float = 10.0) -> str:
    """Stop a registered worker and say how: on another machine by asking; here by SIGTERM (SIGKILL
    if it hangs), only where this user's token proves the process is that worker of this prefix and
    database (identity.vouched): a heartbeat, which anyone can write, may name any process."""
    name = f"{worker.get('role')} pid {worker.get('pid')}"
    if worker.get("host") != socket.gethostname():
        db.request_stop(worker["id"])
        return f"asked {name} on {worker.get('host')} to stop"
    db.remove_worker(worker["id"])
    p = vouched(db, worker)
    if isinstance(p, str):
        return f"{name} left alone: {p}"
    try:
        p.terminate()
    except psutil.NoSuchProcess:
        return f"{name} is gone: left alone"
    deadline = time.monotonic() + timeout
    while _alive(p) and time.monotonic() < deadline:
        time.sleep(0.1)
    if not _alive(p):
        return f"stopped {name}"
    p.kill()
    return f"killed {name} (it did not stop within {timeout:.0f}s)"


def _alive(p: psutil.Process) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE  # a zombie has exited already
    except psutil.NoSuchProcess:
        return False
