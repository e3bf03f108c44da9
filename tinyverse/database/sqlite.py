"""Embedded SQLite backend: one file, many processes on one machine (how it works: docs/database.rst)."""

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
        """This thread's connection: in autocommit mode, so one statement is one transaction."""
        if getattr(self._local, "conn", None) is None:
            conn = sqlite3.connect(self.path, timeout=30, isolation_level=None, check_same_thread=False)
            for tries in range(3000, 0, -1):  # of processes making a new file WAL at once, all but one are refused
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    break
                except sqlite3.OperationalError as e:
                    if not self._is_transient(e) or tries == 1:
                        raise
                    time.sleep(0.01)  # at once, not made to wait as for a lock: try again, up to 30 s
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn  # only once it works: a file that is not a database fails each time
        return self._local.conn

    @contextlib.contextmanager
    def _write(self):
        """Several statements as one transaction that takes the write lock up front, rolled back on error."""
        with self.conn as db:  # commits on leaving, rolls back on an error
            db.execute("BEGIN IMMEDIATE")
            yield db

    def _is_transient(self, e):
        return isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e))

    def _range(self):
        s = self.t["sessions"]  # subqueries: one min(id), max(id) statement scans the table
        sql = f"SELECT (SELECT min(id) FROM {s}), (SELECT max(id) FROM {s}), (SELECT seq FROM sqlite_sequence"
        lo, hi, added = self.conn.execute(sql + " WHERE name = ?)", (s[1:-1],)).fetchone()
        return (1, 0, added or 0) if lo is None else (lo, hi, added)

    def _add(self, blobs, capacity):
        s, meta = self.t["sessions"], self.t["meta"]
        with self._write() as db:
            db.execute(f"INSERT OR IGNORE INTO {meta} VALUES ('capacity', ?)", (str(capacity),))
            db.executemany(f"INSERT INTO {s} (data) VALUES (?)", [(b,) for b in blobs])
            capacity = f"(SELECT CAST(value AS INTEGER) FROM {meta} WHERE key = 'capacity')"
            db.execute(f"DELETE FROM {s} WHERE id <= (SELECT max(id) FROM {s}) - {capacity}")

    def _get(self, ids):
        sql = f"SELECT id, data FROM {self.t['sessions']} WHERE id IN ({','.join('?' * len(ids))}) AND data != x''"
        return dict(self.conn.execute(sql, ids).fetchall())

    def _delete(self, ids):  # an empty record stands in until evicted: the stored range, and so the count, stay
        sql = f"UPDATE {self.t['sessions']} SET data = x'' WHERE id IN ({','.join('?' * len(ids))}) AND data != x''"
        return self.conn.execute(sql, ids).rowcount

    def _set_meta(self, key, value, if_absent):
        if value is None:
            self.conn.execute(f"DELETE FROM {self.t['meta']} WHERE key = ?", (key,))
        else:
            verb = "IGNORE" if if_absent else "REPLACE"
            self.conn.execute(f"INSERT OR {verb} INTO {self.t['meta']} VALUES (?, ?)", (key, value))

    def _get_meta(self, key):
        row = self.conn.execute(f"SELECT value FROM {self.t['meta']} WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def _incr_meta(self, key, n):
        sql = f"INSERT INTO {self.t['meta']} VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = value + ?"
        return int(self.conn.execute(sql + " RETURNING value", (key, n, n)).fetchall()[0][0])

    def _save_params(self, blob, version):
        with self._write() as db:
            row = db.execute(f"SELECT version FROM {self.t['params']}").fetchone()
            if (new := version(0 if row is None else row[0])) is not None:
                db.execute(f"INSERT OR REPLACE INTO {self.t['params']} VALUES (1, ?, ?, ?)", (new, time.time(), blob))
            return new

    def _params(self, data):
        sql = f"SELECT version, time, {'data' if data else 'NULL'} FROM {self.t['params']}"
        return self.conn.execute(sql).fetchone()

    def _heartbeat(self, worker_id, info, ttl):
        with self._write() as db:
            db.execute(f"DELETE FROM {self.t['workers']} WHERE id = ? OR expires < ?", (worker_id, time.time()))
            if info is not None:
                db.execute(f"INSERT INTO {self.t['workers']} VALUES (?, ?, ?)", (worker_id, info, time.time() + ttl))

    def _workers(self):
        sql = f"SELECT info FROM {self.t['workers']} WHERE expires >= ? ORDER BY id"
        return [r[0] for r in self.conn.execute(sql, (time.time(),))]

    def _add_metrics(self, kind, records, limit):
        m = self.t["metrics"]
        with self._write() as db:
            db.executemany(f"INSERT INTO {m} (kind, data) VALUES (?, ?)", [(kind, r) for r in records])
            cut = f"(SELECT id FROM {m} WHERE kind = ? ORDER BY id DESC LIMIT 1 OFFSET ?)"  # the newest one too many
            db.execute(f"DELETE FROM {m} WHERE kind = ? AND id <= {cut}", (kind, kind, limit))

    def _metrics(self, kind, last):
        sql = f"SELECT data FROM (SELECT id, data FROM {self.t['metrics']} WHERE kind = ? ORDER BY id DESC LIMIT ?)"
        return [r[0] for r in self.conn.execute(sql + " ORDER BY id", (kind, last))]

    def _clear(self, what):
        with self._write() as db:
            for name in what - {"settings"}:
                db.execute(f"DELETE FROM {self.t[name]}")
            if "sessions" in what:  # and their layout
                db.execute(f"DELETE FROM {self.t['meta']} WHERE key = 'layout'")
            if "settings" in what:  # stop requests stay: remote workers still stop
                db.execute(f"DELETE FROM {self.t['meta']} WHERE key NOT LIKE 'stop:%'")
                db.execute("DELETE FROM sqlite_sequence WHERE name = ?", (self.t["sessions"][1:-1],))

    def _namespaces(self):
        rows = self.conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE '%:params'")
        return [r[0].rsplit(":", 1)[0] for r in rows]

    def close(self):
        if getattr(self._local, "conn", None) is not None:
            self._local.conn.close()
            self._local.conn = None
