"""Pick a backend by URL, checked here: ``sqlite:///file.db``, ``redis://[:pw@]host:port/db``."""

import os
import re
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlsplit

from ..errors import DatabaseError, masked
from .base import Database

DEFAULT_URL = "sqlite:///tinyverse.db"
SCHEMES = ("sqlite://", "redis://", "rediss://", "unix://")
# the query items of a Redis URL: redis-py's keywords that tinyverse works with, and its own replica
QUERY = {"replica", "db", "username", "password", "client_name", "socket_keepalive"}
QUERY |= {"health_check_interval", "socket_timeout", "socket_connect_timeout"}
TLS = {"ssl_ca_certs", "ssl_ca_path", "ssl_certfile", "ssl_keyfile", "ssl_password"}
WHOLE = {"db", "health_check_interval"}  # read as int by redis-py (the timeouts as float)


TOOL_WAIT = 5.0  # seconds a tool (info, eval, export, ...) waits for the database, then says so


def connect(url=None, prefix="tinyverse", retry_for=None, create=True, capacity=None) -> Database:
    """Open the database at ``url`` (default: $TINYVERSE_DB, else ./tinyverse.db). ``retry_for``:
    seconds an unreachable one is waited for (None: for ever, as workers do; tools: TOOL_WAIT);
    ``create`` False: a missing SQLite file is an error; ``capacity`` (``--buffer-size``): the
    sessions it keeps from now on, for every worker."""
    url = url_from(url)
    if url.startswith("sqlite://"):
        from .sqlite import SQLiteDatabase

        db = SQLiteDatabase(url, prefix, retry_for, create)
    else:
        from .redis import RedisDatabase

        db = RedisDatabase(url, prefix, retry_for)
    if capacity is not None:
        db.set_capacity(capacity)
    return db


def url_from(url: str | None, host=None, port=None, password=None, tls_ca=None) -> str:
    """The URL of ``--db`` (else $TINYVERSE_DB, else ./tinyverse.db), or of ``--host``, ``--port``,
    ``--password`` (which override $TINYVERSE_DB, and are refused with ``--db``); ``--tls-ca``: TLS
    to Redis (rediss://) with the CA certificate of the server's. Checked: DatabaseError."""
    flags = {"--host": host, "--port": port, "--password": password}
    if server := [flag for flag, value in flags.items() if value is not None]:
        if url is not None:
            fix = "pass the URL alone (its password in it), or --host/--port/--password alone"
            raise DatabaseError(f"--db and {server[0]} both name the database: {fix}")
        url = _server_url(host, port, password)
    url = (os.environ.get("TINYVERSE_DB") or DEFAULT_URL) if url is None else url
    if tls_ca is not None:  # redis-py reads the CA from the URL's query
        path = Path(tls_ca).resolve()
        if not path.is_file() or not url.startswith(("redis://", "rediss://")):
            want = "want the CA certificate file (PEM) of a Redis server"
            raise DatabaseError(f"--tls-ca {tls_ca}: {want}")
        query = f"{'&' if '?' in url else '?'}ssl_ca_certs={quote(str(path))}"
        url = f"rediss://{url.split('://', 1)[1]}{query}"
    return checked(url)


def _server_url(host: str | None, port: int | None, password: str | None) -> str:
    """The Redis URL of ``--host``, ``--port`` and ``--password``."""
    name = (host or "localhost").removeprefix("[").removesuffix("]")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+|[0-9A-Fa-f.]*:[0-9A-Fa-f:.]*", name):
        raise DatabaseError(f"--host {host!r}: want a host name or IP address (the port: --port)")
    if password == "":
        raise DatabaseError("--password is empty: give the password, or leave --password out")
    auth = "" if password is None else f":{quote(password, safe='')}@"
    where = f"[{name}]" if ":" in name else name  # an IPv6 address
    return f"redis://{auth}{where}:{6379 if port is None else port}/0"


def checked(url: str) -> str:
    """``url`` if its backend reads it as written; else a DatabaseError that names what to fix."""
    if not url.startswith(SCHEMES) or re.search(r"[\x00-\x1f\x7f]", url):  # a paste gone wrong
        fix = "use sqlite:///path/to/file.db or redis://host:6379/0"
        raise DatabaseError(f"unknown database URL {masked(url)!r}: {fix}")
    if url.startswith("sqlite://"):
        path = Path(url.removeprefix("sqlite://").removeprefix("/") or "tinyverse.db")  # as SQLite
        if set(str(path)) & set("?#") or path.is_dir():
            fix = "want a file's path (no ? or #): sqlite:///dir/file.db"
            raise DatabaseError(f"SQLite URL {masked(url)}: {fix}")
        return url
    try:
        problem = _problem(urlsplit(url))
    except ValueError as e:  # an unclosed [IPv6
        problem = str(e)
    if problem:
        raise DatabaseError(f"bad Redis URL {masked(url)}: {problem}")
    return url


def _problem(parts) -> str | None:
    """What is wrong with a Redis URL, split by urlsplit, if anything."""
    if "@" in parts.path + parts.query or parts.fragment:  # a password cut short by urlsplit
        return "@ or # past the host: percent-encode / ? # @ & in a password (%2F %3F %23 %40 %26)"
    try:
        if parts.port == 0:
            return "port 0: want 1 to 65535"
    except ValueError as e:  # not a number, or past 65535 (the host is whole: no password in it)
        return str(e)
    if parts.scheme != "unix" and not re.fullmatch(r"/?[0-9]*", parts.path):
        return f"DB index {parts.path[1:]!r}: want a whole number, e.g. redis://host:6379/0"
    if parts.scheme == "unix" and not parts.path:
        return "no socket: unix:///path/to/redis.sock"
    items = parse_qsl(parts.query, keep_blank_values=True)
    names = [name for name, _ in items]
    known = QUERY | (TLS if parts.scheme == "rediss" else set())
    given = {"db": parts.scheme != "unix" and parts.path.strip("/"), "password": parts.password}
    given |= {"username": parts.username}  # also in the path or userinfo: redis-py takes one
    for name, value in items:
        if name not in known:
            return f"unknown query item {name!r} (tinyverse takes {', '.join(sorted(known))})"
        if names.count(name) > 1 or given.get(name):
            return f"{name} given twice: keep one"
        if not value:
            return f"{name} has no value"
        if name in WHOLE and not re.fullmatch(r"[0-9]{1,9}", value):
            return f"{name}={value!r}: want a whole number"
        seconds = re.fullmatch(r"[0-9]*\.?[0-9]+", value) and float(value) > 0
        if name.endswith("_timeout") and not seconds:
            return f"{name}={value!r}: want seconds, more than 0"
    return None


def split_replica(url: str) -> tuple[str, str | None]:
    """The URL without its ``replica=HOST:PORT`` query item, and that URL pointed at the replica
    (None: none named)."""
    parts = urlsplit(url)
    items = [q for q in parts.query.split("&") if q]
    named = [q.removeprefix("replica=") for q in items if q.startswith("replica=")]
    if not named:
        return url, None
    if not re.fullmatch(r"[^:/@]+:\d+", named[-1]):
        raise DatabaseError(f"bad replica={named[-1]!r} in the Redis URL: use ?replica=HOST:PORT")
    primary = parts._replace(query="&".join(q for q in items if not q.startswith("replica=")))
    auth = parts.netloc.rpartition("@")[0]
    replica = primary._replace(netloc=f"{auth}@{named[-1]}" if auth else named[-1])
    return primary.geturl(), replica.geturl()
