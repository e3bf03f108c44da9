"""Embedded SQLite backend: one file, many processes on one machine.

WAL mode lets readers run beside one writer; ``BEGIN IMMEDIATE`` takes the
write lock up front so an append and its eviction are one transaction; a busy
timeout makes concurrent writers queue instead of failing. Ids grow by one per
session and eviction deletes the oldest, so the stored ids are ``min(id)..max(id)``
(a corrupt record removed leaves an empty one until evicted) and sampling picks ids in that range.
"""

import contextlib
import os
import sqlite3
import threading
import time

from ..errors import DatabaseError
from .base import Database

TABLES = {
    "sessions": "id INTEGER PRIMARY KEY AUTOINCREMENT, data BLOB NOT NULL",
    "params": "one INTEGER PRIMARY KEY CHECK (one = 1), version INTEGER, time REAL, data BLOB",
    "meta": "key TEXT PRIMARY KEY, value TEXT",
    "workers": "id TEXT PRIMARY KEY, info TEXT, expires REAL",
    "metrics": "id INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT, data TEXT",
}


class SQLiteDatabase(Database):
    errors = (sqlite3.Error,)

    def _is_transient(self, e):
        return isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e))

    def __init__(self, url: str, prefix: str = "tinyverse", retry_for: float | None = None, create: bool = True):
        super().__init__(url, prefix, retry_for)
        self.path = url.split("sqlite://", 1)[1].removeprefix("/") or "tinyverse.db"
        if not create and not os.path.exists(self.path):
            raise DatabaseError(f"no SQLite database at {self.path}: check --db (or $TINYVERSE_DB)")
        self.t = {name: f'"{prefix}:{name}"' for name in TABLES}
        self._local = threading.local()
        try:
            with self._write() as db:
                for name, columns in TABLES.items():
                    db.execute(f"CREATE TABLE IF NOT EXISTS {self.t[name]} ({columns})")
                db.execute(f'CREATE INDEX IF NOT EXISTS "{prefix}:metrics_kind" ON {self.t["metrics"]} (kind, id)')
        except sqlite3.DatabaseError as e:
            raise DatabaseError(f"cannot open SQLite database {self.path} ({e}); check the --db path") from None

    @property
    def conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn
        return conn

    @contextlib.contextmanager
    def _write(self):
        """``BEGIN IMMEDIATE`` ... ``COMMIT``, rolled back on error."""
        db = self.conn
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _range(self):
        s = self.t["sessions"]  # two subqueries: one min(id), max(id) statement scans the table
        lo, hi = self.conn.execute(f"SELECT (SELECT min(id) FROM {s}), (SELECT max(id) FROM {s})").fetchone()
        seq = self.conn.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (s[1:-1],)).fetchone()
        return (1, 0, seq[0] if seq else 0) if lo is None else (lo, hi, seq[0])

    def _add(self, blobs, capacity):
        with self._write() as db:
            db.execute(f"INSERT OR IGNORE INTO {self.t['meta']} VALUES ('capacity', ?)", (str(capacity),))
            db.executemany(f"INSERT INTO {self.t['sessions']} (data) VALUES (?)", [(b,) for b in blobs])
            self._evict(db)

    def _evict(self, db):
        """Delete the oldest sessions beyond the stored capacity (in the caller's transaction)."""
        capacity = int(db.execute(f"SELECT value FROM {self.t['meta']} WHERE key = 'capacity'").fetchone()[0])
        db.execute(f"DELETE FROM {self.t['sessions']} WHERE id <= ?", (self._range()[1] - capacity,))

    def _get(self, ids):
        sql = f"SELECT id, data FROM {self.t['sessions']} WHERE id IN ({','.join('?' * len(ids))}) AND data != x''"
        return dict(self.conn.execute(sql, ids).fetchall())

    def _delete(self, ids):  # an empty record stands in until evicted: the stored range, and so the count, stay
        with self._write() as db:
            sql = f"UPDATE {self.t['sessions']} SET data = x'' WHERE id IN ({','.join('?' * len(ids))}) AND data != x''"
            return db.execute(sql, ids).rowcount

    def _set_meta(self, key, value, if_absent):
        with self._write() as db:
            if value is None:
                db.execute(f"DELETE FROM {self.t['meta']} WHERE key = ?", (key,))
                return
            verb = "IGNORE" if if_absent else "REPLACE"
            db.execute(f"INSERT OR {verb} INTO {self.t['meta']} VALUES (?, ?)", (key, value))

    def _get_meta(self, key):
        row = self.conn.execute(f"SELECT value FROM {self.t['meta']} WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def _incr_meta(self, key, n):
        sql = f"INSERT INTO {self.t['meta']} VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = value + ?"
        sql += " RETURNING value"
        with self._write() as db:
            return int(db.execute(sql, (key, n, n)).fetchone()[0])

    def _save_params(self, blob, min_version, if_absent, expect):
        with self._write() as db:
            row = db.execute(f"SELECT version FROM {self.t['params']}").fetchone()
            if (row is not None and if_absent) or expect not in (-1, row[0] if row else 0):
                return None
            version = max((row[0] if row else 0) + 1, min_version)
            db.execute(f"INSERT OR REPLACE INTO {self.t['params']} VALUES (1, ?, ?, ?)", (version, time.time(), blob))
            return version

    def _load_params(self):
        return self.conn.execute(f"SELECT version, data FROM {self.t['params']}").fetchone()

    def _params_version(self):
        return self.conn.execute(f"SELECT version, time FROM {self.t['params']}").fetchone()

    def _heartbeat(self, worker_id, info, ttl):
        with self._write() as db:
            db.execute(f"DELETE FROM {self.t['workers']} WHERE expires < ?", (time.time(),))
            db.execute(
                f"INSERT OR REPLACE INTO {self.t['workers']} VALUES (?, ?, ?)", (worker_id, info, time.time() + ttl)
            )

    def _workers(self):
        sql = f"SELECT info FROM {self.t['workers']} WHERE expires >= ? ORDER BY id"
        return [r[0] for r in self.conn.execute(sql, (time.time(),))]

    def _remove_worker(self, worker_id):
        with self._write() as db:
            db.execute(f"DELETE FROM {self.t['workers']} WHERE id = ?", (worker_id,))

    def _add_metrics(self, kind, records, limit):
        m = self.t["metrics"]
        with self._write() as db:
            db.executemany(f"INSERT INTO {m} (kind, data) VALUES (?, ?)", [(kind, r) for r in records])
            cut = db.execute(f"SELECT id FROM {m} WHERE kind = ? ORDER BY id DESC LIMIT 1 OFFSET ?", (kind, limit))
            row = cut.fetchone()
            if row is not None:
                db.execute(f"DELETE FROM {m} WHERE kind = ? AND id <= ?", (kind, row[0]))

    def _metrics(self, kind, last):
        sql = f"SELECT data FROM (SELECT id, data FROM {self.t['metrics']} WHERE kind = ? ORDER BY id DESC LIMIT ?)"
        return [r[0] for r in self.conn.execute(sql + " ORDER BY id", (kind, last))]

    def _clear(self, what):
        with self._write() as db:
            for name in what:
                db.execute(f"DELETE FROM {self.t[name]}")
            if "sessions" in what:
                db.execute(f"DELETE FROM {self.t['meta']} WHERE key = 'layout'")
            if what >= {"sessions", "params", "workers", "metrics"}:  # a fresh start: counters and settings too
                db.execute(f"DELETE FROM {self.t['meta']} WHERE key NOT LIKE 'stop:%'")  # remote workers still stop
                db.execute("DELETE FROM sqlite_sequence WHERE name = ?", (self.t["sessions"][1:-1],))

    def _namespaces(self):
        rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%:params'")
        return [r[0].rsplit(":", 1)[0] for r in rows]

    def close(self):
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
