"""Embedded SQLite backend: one file, many processes on one machine (docs/database.rst)."""

import contextlib
import os
import sqlite3
import threading
import time

from ..errors import DatabaseError
from .base import Database
from .records import number
from .tables import MARK, TABLES, prefixes_in

LOCK_WAIT = 30.0  # seconds a worker's statement waits for the write lock; then it says so, waits on


class SQLiteDatabase(Database):
    errors = (sqlite3.Error,)

    def __init__(self, url: str, prefix="tinyverse", retry_for: float | None = None, create=True):
        super().__init__(url, prefix, retry_for)
        self.path = url.split("sqlite://", 1)[1].removeprefix("/") or "tinyverse.db"
        if not create and not os.path.exists(self.path):
            raise DatabaseError(f"no SQLite database at {self.path}: check --db (or $TINYVERSE_DB)")
        self.t = {name: f'"{prefix}:{name}"' for name in TABLES}
        self.busy = LOCK_WAIT if retry_for is None else min(retry_for, 5.0)  # tools: within seconds
        self._local = threading.local()
        self._call(self._open)

    def _open(self) -> None:
        """Refuse a file that holds another application's tables before writing anything (its
        journal mode included); then create this prefix's tables, and mark them and older ones."""
        with contextlib.closing(sqlite3.connect(self.path, timeout=self.busy)) as plain:
            found = prefixes_in(plain, self.path) | {self.prefix}
        with self._write() as db:
            for name, columns in TABLES.items():
                db.execute(f"CREATE TABLE IF NOT EXISTS {self.t[name]} ({columns})")
            index = f'"{self.prefix}:metrics_kind"'
            db.execute(f"CREATE INDEX IF NOT EXISTS {index} ON {self.t['metrics']} (kind, id)")
            db.execute(MARK.replace("TABLE", "TABLE IF NOT EXISTS"))
            marks = [(prefix,) for prefix in sorted(found)]
            db.executemany("INSERT OR IGNORE INTO tinyverse_prefixes VALUES (?)", marks)

    @property
    def conn(self) -> sqlite3.Connection:
        """This thread's connection: in autocommit mode, so one statement is one transaction."""
        if getattr(self._local, "conn", None) is None:
            opts = dict(timeout=self.busy, isolation_level=None, check_same_thread=False)
            conn = sqlite3.connect(self.path, **opts)
            for tries in range(int(self.busy * 100), -1, -1):  # of those making it WAL, one wins
                try:
                    conn.execute("PRAGMA journal_mode=WAL")
                    break
                except sqlite3.OperationalError as e:
                    if not self._is_transient(e) or tries == 0:
                        raise
                    time.sleep(0.01)  # refused at once, not made to wait: try again, as for a lock
            conn.execute("PRAGMA synchronous=NORMAL")
            self._local.conn = conn  # once it works: a file that is no database fails each time
        return self._local.conn

    @contextlib.contextmanager
    def _write(self):
        """One transaction of statements, the write lock taken up front; rolled back on error."""
        with self.conn as db:  # commits on leaving, rolls back on an error
            db.execute("BEGIN IMMEDIATE")
            yield db

    def _is_transient(self, e):
        return isinstance(e, sqlite3.OperationalError) and ("locked" in str(e) or "busy" in str(e))

    def _outage(self, error):
        waiting = f"waiting for the write lock of {self.path} held by another process"
        fix = "try again once it is done, or check --db"
        return waiting, f"{self.path} is locked by another process ({error}): {fix}"

    def _range(self):
        s = self.t["sessions"]  # subqueries: one min(id), max(id) statement scans the table
        sql = f"SELECT (SELECT min(id) FROM {s}), (SELECT max(id) FROM {s}), "
        sql += "(SELECT seq FROM sqlite_sequence WHERE name = ?)"
        lo, hi, added = self.conn.execute(sql, (s[1:-1],)).fetchone()
        added = number(added or 0, int, f"{s}'s row of sqlite_sequence", self.junk)
        return (1, 0, added) if lo is None else (lo, hi, added)

    def _add(self, blobs, capacity):
        s, meta = self.t["sessions"], self.t["meta"]
        with self._write() as db:
            db.execute(f"INSERT OR IGNORE INTO {meta} VALUES ('capacity', ?)", (str(capacity),))
            stored = db.execute(f"SELECT value FROM {meta} WHERE key = 'capacity'").fetchone()[0]
            what = f"setting 'capacity' of prefix {self.prefix}"
            capacity = number(stored, int, what, self.junk, 1)  # junk would evict every session
            db.executemany(f"INSERT INTO {s} (data) VALUES (?)", [(b,) for b in blobs])
            db.execute(f"DELETE FROM {s} WHERE id <= (SELECT max(id) FROM {s}) - ?", (capacity,))

    def _get(self, ids):
        marks = ",".join("?" * len(ids))
        sql = f"SELECT id, data FROM {self.t['sessions']} WHERE id IN ({marks}) AND data != x''"
        return dict(self.conn.execute(sql, ids).fetchall())

    def _delete(self, ids):  # an empty record stands in until evicted: the range, the count stay
        marks = ",".join("?" * len(ids))
        sql = f"UPDATE {self.t['sessions']} SET data = x'' WHERE id IN ({marks}) AND data != x''"
        return self.conn.execute(sql, ids).rowcount

    def _set_meta(self, key, value, if_absent):
        if value is None:
            self.conn.execute(f"DELETE FROM {self.t['meta']} WHERE key = ?", (key,))
        else:
            verb = "IGNORE" if if_absent else "REPLACE"
            self.conn.execute(f"INSERT OR {verb} INTO {self.t['meta']} VALUES (?, ?)", (key, value))

    def _get_meta(self, key):
        rows = self.conn.execute(f"SELECT value FROM {self.t['meta']} WHERE key = ?", (key,))
        return next((row[0] for row in rows), None)

    def _incr_meta(self, key, n):
        sql = f"INSERT INTO {self.t['meta']} VALUES (?, ?) ON CONFLICT DO UPDATE SET value=value+?"
        return self.conn.execute(sql + " RETURNING value", (key, n, n)).fetchall()[0][0]

    def _save_params(self, blob, version, name=None):
        table, key, value = self._row(name)
        with self._write() as db:
            row = db.execute(f"SELECT version FROM {table} WHERE {key} = ?", (value,)).fetchone()
            if (new := version(0 if row is None else self._saved(row[0], 0, name)[0])) is not None:
                saved = (value, new, time.time(), blob)
                db.execute(f"REPLACE INTO {table} VALUES (?, ?, ?, ?)", saved)
            return new

    def _params(self, data, name=None):
        table, key, value = self._row(name)
        sql = f"SELECT version, time, {'data' if data else 'NULL'} FROM {table} WHERE {key} = ?"
        row = self.conn.execute(sql, (value,)).fetchone()
        return None if row is None else (*self._saved(*row[:2], name), row[2])

    def _row(self, name: str | None) -> tuple[str, str, str | int]:
        """The table, key column and key of the rolling params (``name`` None) or a snapshot."""
        return (self.t["params"], "one", 1) if name is None else (self.t["snapshots"], "name", name)

    def _snapshots(self, limit):
        sql = f"SELECT name, version, time FROM {self.t['snapshots']} LIMIT ?"
        return self.conn.execute(sql, (limit,)).fetchall()

    def _delete_snapshot(self, name):
        sql = f"DELETE FROM {self.t['snapshots']} WHERE name = ?"
        return self.conn.execute(sql, (name,)).rowcount > 0

    def _heartbeat(self, worker_id, info, ttl):
        w = self.t["workers"]
        now = time.time()
        with self._write() as db:
            db.execute(f"DELETE FROM {w} WHERE id = ? OR expires < ?", (worker_id, now))
            if info is not None:
                db.execute(f"INSERT INTO {w} VALUES (?, ?, ?)", (worker_id, info, now + ttl))

    def _workers(self):
        sql = f"SELECT id, info FROM {self.t['workers']} WHERE expires >= ? ORDER BY id"
        return self.conn.execute(sql, (time.time(),)).fetchall()

    def _add_metrics(self, kind, records, limit):
        m = self.t["metrics"]
        with self._write() as db:
            rows = [(kind, r) for r in records]
            db.executemany(f"INSERT INTO {m} (kind, data) VALUES (?, ?)", rows)
            too_many = f"(SELECT id FROM {m} WHERE kind = ? ORDER BY id DESC LIMIT 1 OFFSET ?)"
            db.execute(f"DELETE FROM {m} WHERE kind = ? AND id <= {too_many}", (kind, kind, limit))

    def _metrics(self, kind, last):
        newest = f"SELECT id, data FROM {self.t['metrics']} WHERE kind = ? ORDER BY id DESC LIMIT ?"
        sql = f"SELECT data FROM ({newest}) ORDER BY id"
        return [r[0] for r in self.conn.execute(sql, (kind, last))]

    def _clear(self, what):
        with self._write() as db:
            for name in what - {"settings"} | ({"snapshots"} if "params" in what else set()):
                db.execute(f"DELETE FROM {self.t[name]}")  # the params take their snapshots along
            if "sessions" in what:  # and their layout
                db.execute(f"DELETE FROM {self.t['meta']} WHERE key = 'layout'")
            if "settings" in what:  # stop requests stay: remote workers still stop
                db.execute(f"DELETE FROM {self.t['meta']} WHERE key NOT LIKE 'stop:%'")
                sessions = self.t["sessions"][1:-1]  # unquoted
                db.execute("DELETE FROM sqlite_sequence WHERE name = ?", (sessions,))

    def _namespaces(self):
        return [r[0] for r in self.conn.execute("SELECT prefix FROM tinyverse_prefixes")]

    def close(self):
        if getattr(self._local, "conn", None) is not None:
            self._local.conn.close()
            self._local.conn = None
