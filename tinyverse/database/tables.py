"""The SQLite backend's tables (``<prefix>:<name>``), the mark of a file of tinyverse's, and the
prefixes a file holds: another application's file is refused before anything is written."""

import re
import sqlite3

from ..errors import DatabaseError

TABLES = {
    "sessions": "id INTEGER PRIMARY KEY AUTOINCREMENT, data BLOB NOT NULL",
    "params": "one INTEGER PRIMARY KEY CHECK (one = 1), version INTEGER, time REAL, data BLOB",
    "meta": "key TEXT PRIMARY KEY, value TEXT",
    "workers": "id TEXT PRIMARY KEY, info TEXT, expires REAL",
    "metrics": "id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT, data TEXT",
    "snapshots": "name TEXT PRIMARY KEY, version INTEGER, time REAL, data BLOB",
}
MARK = "CREATE TABLE tinyverse_prefixes (prefix TEXT PRIMARY KEY)"  # the file is ours: its prefixes
NAMES = "|".join([*TABLES, "metrics_kind"])  # the tables and the index of a prefix
OURS = re.compile(rf"([A-Za-z0-9_.-]{{1,64}}):({NAMES})")


def prefixes_in(conn: sqlite3.Connection, path: str) -> set[str]:
    """The prefixes of a file's tinyverse tables, marked or of an earlier version (unmarked);
    DatabaseError if it holds anything else: tables, views or triggers of another application."""
    found, foreign = set(), []  # the prefixes of ours; the names of another application's
    for kind, name, sql in conn.execute("SELECT type, name, sql FROM sqlite_master"):
        if (ours := OURS.fullmatch(name)) and kind in ("table", "index"):
            found.add(ours[1])
        elif not (name.startswith("sqlite_") or sql == MARK):  # SQLite's own: indexes, sequences
            foreign.append(name)
    if foreign:
        listed = ", ".join(map(repr, foreign[:3])) + (", ..." if len(foreign) > 3 else "")
        fix = "tinyverse writes only to a file of its own: pass another --db"
        raise DatabaseError(f"{path} holds tables that are not tinyverse's ({listed}): {fix}")
    return found
