"""Pick a backend by URL: ``sqlite:///file.db`` or ``redis://[:password@]host:port/db``."""

import os

from ..errors import DatabaseError, masked
from .base import Database

DEFAULT_URL = "sqlite:///tinyverse.db"


def connect(
    url: str | None = None, prefix: str = "tinyverse", retry_for: float | None = None, create: bool = True
) -> Database:
    """Open the database at ``url`` (default: $TINYVERSE_DB, else ./tinyverse.db). ``retry_for``: seconds an unreachable
    server is waited for (None: for ever, as workers should); ``create`` False: a missing SQLite file is an error."""
    url = url or os.environ.get("TINYVERSE_DB") or DEFAULT_URL
    if url.startswith("sqlite://"):
        from .sqlite import SQLiteDatabase

        return SQLiteDatabase(url, prefix, retry_for, create)
    if url.startswith(("redis://", "rediss://", "unix://")):
        from .redis import RedisDatabase

        return RedisDatabase(url, prefix, retry_for)
    raise DatabaseError(f"unknown database URL {masked(url)!r}: use sqlite:///path/to/file.db or redis://host:6379/0")
