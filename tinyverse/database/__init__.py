"""Pick a backend by URL: ``sqlite:///file.db`` or ``redis://[:password@]host:port/db``."""

import os

from ..errors import DatabaseError
from .base import Database

DEFAULT_URL = "sqlite:///tinyverse.db"


def connect(url: str | None = None, prefix: str = "tinyverse", retry_for: float | None = None) -> Database:
    """Open the database at ``url`` (default: $TINYVERSE_DB, else ./tinyverse.db).

    ``retry_for`` bounds how many seconds an unreachable server is waited for;
    None waits for ever, as long-running players and trainers should.
    """
    url = url or os.environ.get("TINYVERSE_DB") or DEFAULT_URL
    if url.startswith("sqlite://"):
        from .sqlite import SQLiteDatabase

        return SQLiteDatabase(url, prefix, retry_for)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from .redis import RedisDatabase

        return RedisDatabase(url, prefix, retry_for)
    raise DatabaseError(f"unknown database URL {url!r}: use sqlite:///path/to/file.db or redis://host:6379/0")


__all__ = ["Database", "DatabaseError", "connect", "DEFAULT_URL"]
