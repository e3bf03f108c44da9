"""Pick a backend by URL: ``sqlite:///file.db`` or ``redis://[:password@]host:port/db``."""

import os
from pathlib import Path
from urllib.parse import quote

from ..errors import DatabaseError, masked
from .base import Database

DEFAULT_URL = "sqlite:///tinyverse.db"


def connect(
    url: str | None = None, prefix: str = "tinyverse", retry_for: float | None = None, create: bool = True
) -> Database:
    """Open the database at ``url`` (default: $TINYVERSE_DB, else ./tinyverse.db). ``retry_for``: seconds an unreachable
    server is waited for (None: for ever, as workers should); ``create`` False: a missing SQLite file is an error."""
    url = url_from(url)
    if url.startswith("sqlite://"):
        from .sqlite import SQLiteDatabase

        return SQLiteDatabase(url, prefix, retry_for, create)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from .redis import RedisDatabase

        return RedisDatabase(url, prefix, retry_for)
    raise DatabaseError(f"unknown database URL {masked(url)!r}: use sqlite:///path/to/file.db or redis://host:6379/0")


def url_from(url: str | None, host=None, port=None, password=None, tls_ca=None) -> str:
    """The URL of ``--db`` (else $TINYVERSE_DB, else ./tinyverse.db), or of ``--host/--port/--password``; ``--tls-ca``:
    TLS to Redis (rediss://), with the CA certificate that signed the server's."""
    url = url or os.environ.get("TINYVERSE_DB") or DEFAULT_URL
    if host or port or password:
        auth = f":{quote(password, safe='')}@" if password else ""
        url = f"redis://{auth}{host or 'localhost'}:{port or 6379}/0"
    if tls_ca:  # redis-py reads the CA from the URL's query
        path = Path(tls_ca).resolve()
        if not path.is_file() or not url.startswith(("redis://", "rediss://")):
            raise DatabaseError(f"--tls-ca {tls_ca}: want the CA certificate file (PEM) of a Redis server")
        url = f"rediss://{url.split('://', 1)[1]}{'&' if '?' in url else '?'}ssl_ca_certs={quote(str(path))}"
    return url
