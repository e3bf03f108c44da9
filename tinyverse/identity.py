"""Proof that a local process is a worker of this user: a token file the worker writes as it
starts, in a folder only this user can write, naming its id, PID, start time, prefix and database.
A heartbeat in the database can name any process; ``clear`` signals one only when such a token
vouches for it (docs/guarantees.rst)."""

import hashlib
import json
import logging
import os
import socket
import stat
from pathlib import Path

import psutil

log = logging.getLogger(__name__)
VOUCHES = ("id", "role", "host", "pid", "proc_start")  # a worker's info; a token adds prefix, db


def folder() -> Path:
    """Where tokens live: the cache outlives a logout (unlike $XDG_RUNTIME_DIR) and tmp cleaners."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "tinyverse" / "workers"


def private(st: os.stat_result, kind=stat.S_ISREG) -> bool:
    """Whether what ``st`` describes is of ``kind``, this user's, and closed to everyone else."""
    return kind(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o077


def unsafe(where: Path) -> str | None:
    """Why the folder cannot be trusted (a link, another owner, open to others), or None."""
    if not os.path.lexists(where) or private(os.lstat(where), stat.S_ISDIR):
        return None  # nothing there is nothing to fear: a worker makes it private
    return f"{where} is not a private folder of uid {os.getuid()} (mode 700): remove it"


def database(db) -> str:
    """The database however it is spelled: a SQLite file by its absolute path; masked, as db.url."""
    return f"sqlite:///{os.path.realpath(db.path)}" if db.url.startswith("sqlite:") else db.url


def path_of(worker_id: str) -> Path:
    """A worker's token file, named by a digest: an id from the database can name no other file."""
    return folder() / f"{hashlib.sha256(worker_id.encode()).hexdigest()[:32]}.json"


def write(db, info: dict) -> Path | None:
    """Write the token of the worker ``info`` describes, after sweeping those of gone workers; None
    (and a warning) where the folder is unsafe: ``clear`` then leaves the worker alone."""
    path = path_of(info["id"])
    where = path.parent
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        if (why := unsafe(where)) is not None:
            raise PermissionError(why)
        sweep(where)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as e:
        log.warning("no token for clear to stop this worker by: %s", e)
        return None
    token = {key: info[key] for key in VOUCHES} | {"prefix": db.prefix, "db": database(db)}
    with os.fdopen(fd, "w") as f:
        json.dump(token, f)
    return path


def read(path: Path) -> dict | None:
    """The token at ``path`` if it is a plain file of this user that only this user may use."""
    try:
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), "rb") as f:
            token = json.loads(f.read(4096)) if private(os.fstat(f.fileno())) else None
    except (OSError, ValueError):  # missing, a link, half written, not JSON
        return None
    return token if isinstance(token, dict) else None


def process(token: dict) -> psutil.Process | None:
    """The live process the token names: the same PID and start time (a reused PID has another)."""
    try:
        p = psutil.Process(int(token["pid"]))
        same = p.create_time() == token["proc_start"]
        return p if same and p.status() != psutil.STATUS_ZOMBIE else None
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


def sweep(where: Path) -> None:
    """Remove the tokens of this host's gone workers: one killed by -9 could not remove its own."""
    host = socket.gethostname()
    for path in where.glob("*.json"):
        token = read(path)
        if token is not None and token.get("host") == host and process(token) is None:
            path.unlink(missing_ok=True)


def vouched(db, worker: dict) -> psutil.Process | str:
    """The process a heartbeat of this host names, if this user's token says it is that worker of
    ``db``'s prefix and database, alive; else why not, in a few words."""
    if (why := unsafe(folder())) is not None:
        return why
    token = read(path_of(str(worker.get("id"))))
    if token is None:
        return "no token of this user for it (not a worker this user started here)"
    if any(token.get(key) != worker.get(key) for key in VOUCHES if key != "proc_start"):
        return "its token names another worker"
    if (token.get("prefix"), token.get("db")) != (db.prefix, database(db)):
        return f"its token names another namespace ({token.get('prefix')} in {token.get('db')})"
    return process(token) or "gone (or its PID now belongs to another process)"
