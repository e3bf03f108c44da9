"""The database contract that players, trainers and tools share.

A backend implements the ``_primitives`` at the bottom and inherits the rest:
encoding, decoding, removing corrupt records, waiting out an unreachable server.
Every backend runs one conformance suite, ``tests/test_database.py``. Stored per
namespace (``prefix``): sessions, a ring with ids 1, 2, 3, ... (an append evicts
the oldest beyond the capacity; sampling draws ids uniformly from the stored
range, at a cost that does not depend on how many are stored); params, with a
version that only grows; workers, JSON heartbeats that expire; metrics, bounded
JSON lists by kind; meta, settings and counters (capacity, options, session
layout, trainer updates, corrupt records removed, stop requests).
"""

import json
import logging
import random
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from ..encoding import decode, decode_batch, encode
from ..errors import DatabaseError, RecordError, masked

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]
PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
METRICS_LIMIT = 100_000  # records kept per metrics kind
STOP_TTL = 600.0  # seconds a stop request waits for its worker


class Database:
    """Sessions, params, workers and metrics of one namespace."""

    def __init__(self, url: str, prefix: str = "tinyverse", retry_for: float | None = None):
        if not PREFIX_RE.match(prefix):
            raise DatabaseError(f"bad prefix {prefix!r}: use 1-64 letters, digits, '_', '.' or '-'")
        self.url, self.prefix, self.retry_for = masked(url), prefix, retry_for
        self.layout: list | None = None  # sessions of another layout are never handed out
        self._said: dict[str, float] = {}

    def _call(self, fn: Callable, *args: Any) -> Any:
        """Run a primitive, waiting out an unreachable database with backoff."""
        start, delay, warned = time.monotonic(), 0.2, False
        while True:
            try:
                result = fn(*args)
                if warned:
                    log.warning("database %s is back", self.url)
                return result
            except Exception as e:
                if not self._is_transient(e):
                    raise
                if self.retry_for is not None and time.monotonic() - start >= self.retry_for:
                    raise DatabaseError(
                        f"cannot reach database {self.url} ({type(e).__name__}: {e}); "
                        "start the server or pass --db sqlite:///tinyverse.db"
                    ) from None
                if not warned:
                    log.warning("database %s unreachable (%s); waiting with backoff", self.url, e)
                    warned = True
                time.sleep(delay)
                delay = min(delay * 2, 10.0)

    def _warn(self, what: str, message: str, *args: Any, every: float = 30.0) -> None:
        """Log ``message`` at most once every ``every`` seconds per ``what``."""
        if time.monotonic() - self._said.get(what, -every) >= every:
            self._said[what] = time.monotonic()
            log.warning(message, *args)

    # -- sessions ---------------------------------------------------------------
    def add_sessions(self, sessions: list[Arrays], capacity: int) -> None:
        """Append sessions atomically; ``capacity`` is stored if none is stored yet."""
        if sessions:  # SQLite's eviction reads last_insert_rowid(), which only an insert sets
            self._call(self._add, [encode(s) for s in sessions], int(capacity))

    def sample_batch(self, n: int) -> Arrays:
        """``n`` sessions drawn uniformly, stacked into ``{name: (k, ...)}`` arrays with ``id``.

        k < n when records were skipped (corrupt ones are removed for good; those of
        another layout than ``self.layout`` are left alone); ``{}`` when none are stored.
        """
        out: list[tuple[int, bytes]] = []
        for _ in range(10):  # ids evicted or removed between reading the range and the rows are redrawn
            lo, hi = self._call(self._range)
            if hi < lo or n < 1:
                break
            out += self._call(self._rows, [random.randint(lo, hi) for _ in range(n - len(out))])
            if len(out) == n:
                break
        return self._batch(out)

    def get_batch(self, ids: list[int]) -> Arrays:
        """The stored ones of ``ids``, in order (repeats kept), stacked as by ``sample_batch``."""
        return self._batch(self._call(self._rows, ids))

    def _rows(self, ids) -> list[tuple[int, bytes]]:
        """``(id, record)`` of the stored ones of ``ids``, in order, repeats kept: one fetch."""
        ids = [int(i) for i in ids]
        found = self._get(sorted(set(ids))) if ids else {}  # HMGET of no fields is an error in Redis
        return [(i, found[i]) for i in ids if i in found]

    def _batch(self, rows: list[tuple[int, bytes]]) -> Arrays:
        batch, kept, errors = decode_batch([blob for _, blob in rows], self.layout)
        if errors:
            bad = sorted({rows[j][0] for j, _ in errors})
            if removed := self._call(self._delete, bad):  # another process may have removed some first
                self._call(self._incr_meta, "corrupt", removed)
            self._warn("corrupt", "removed %d corrupt sessions from %s (%s)", len(bad), self.prefix, errors[0][1])
        if len(kept) + len(errors) < len(rows):
            fix = "delete them with python -m tinyverse EXP clear --del-sessions, or use another --prefix"
            self._warn("layout", "skipped sessions of another layout in %s: %s", self.prefix, fix)
        if batch:
            batch["id"] = np.array([rows[j][0] for j in kept], np.int64)
        return batch

    def session_range(self) -> tuple[int, int]:
        """(oldest, newest) stored id; newest < oldest when none are stored."""
        return self._call(self._range)

    def count_sessions(self) -> tuple[int, int]:
        """(stored now, ever added); removed corrupt records count as stored until evicted."""
        return self._call(self._count)

    def set_capacity(self, capacity: int) -> None:
        """Keep at most ``capacity`` sessions, evicting the oldest now."""
        if capacity < 1:
            raise DatabaseError(f"buffer size must be positive, got {capacity}")
        old = self.capacity()
        self._call(self._set_meta, "capacity", str(int(capacity)), False)
        if old not in (None, capacity):
            log.warning("buffer size of %s: %d sessions, was %d (for every worker)", self.prefix, capacity, old)

    def capacity(self) -> int | None:
        return None if (value := self._call(self._get_meta, "capacity")) is None else int(value)

    def claim(self, key: str, value: Any) -> Any:
        """Store ``value`` (as JSON) under ``key`` unless one is stored; return the stored one."""
        self._call(self._set_meta, key, json.dumps(value), True)
        return self.setting(key)

    def setting(self, key: str) -> Any:
        """The JSON value stored under ``key`` by :meth:`claim`, or None."""
        value = self._call(self._get_meta, key)
        try:
            return None if value is None else json.loads(value)
        except ValueError:
            raise DatabaseError(f"stored setting {key!r} in {self.prefix} is corrupt; clear --all resets it") from None

    def add_updates(self, n: int) -> int:
        """Count ``n`` more trainer updates; return the total (the pace's counter)."""
        return self._call(self._incr_meta, "updates", int(n))

    def counter(self, name: str) -> int:
        """A counter of :meth:`add_updates` ("updates") or of removed records ("corrupt")."""
        return int(self._call(self._get_meta, name) or 0)

    # -- params -----------------------------------------------------------------
    def save_params(
        self, params: Arrays, min_version: int = 0, if_absent: bool = False, expect: int | None = None
    ) -> int | None:
        """Store params with version max(stored + 1, min_version); return it.

        Nothing is written (and None returned) with ``if_absent`` when params
        exist, so a random init never overwrites trained params, and with
        ``expect`` unless the stored version is ``expect`` (a compare-and-set).
        """
        return self._call(
            self._save_params, encode(params), int(min_version), if_absent, -1 if expect is None else expect
        )

    def load_params(self) -> tuple[int, Arrays] | None:
        """(version, params) or None when none are stored."""
        found = self._call(self._load_params)
        if found is None:
            return None
        try:
            return found[0], decode(found[1])
        except RecordError as e:
            raise RecordError(
                f"the stored params of {self.prefix} are {e}; delete them with python -m tinyverse EXP clear "
                "--del-weights (a trainer then starts from a random init)"
            ) from None

    def params_version(self, saved: bool = False) -> int | None | tuple[int, float]:
        """The stored params' version, or (version, Unix time saved) with ``saved``; None if none."""
        found = self._call(self._params_version)
        return found if found is None or saved else found[0]

    # -- workers ----------------------------------------------------------------
    def heartbeat(self, worker_id: str, info: dict, ttl: float = 10.0) -> None:
        self._call(self._heartbeat, worker_id, json.dumps(info), float(ttl))

    def workers(self) -> list[dict]:
        return [json.loads(s) for s in self._call(self._workers)]

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker, and any stop request for it."""
        self._call(self._remove_worker, worker_id)
        self._call(self._set_meta, f"stop:{worker_id}", None, False)

    def request_stop(self, worker_id: str) -> None:
        """Ask a worker (on any machine) to stop at its next heartbeat; ``clear`` keeps the request."""
        self._call(self._set_meta, f"stop:{worker_id}", str(time.time() + STOP_TTL), False)

    def stop_requested(self, worker_id: str) -> bool:
        return float(self._call(self._get_meta, f"stop:{worker_id}") or 0) > time.time()

    # -- metrics ----------------------------------------------------------------
    def add_metrics(self, kind: str, records: list[dict]) -> None:
        if records:
            self._call(self._add_metrics, kind, [json.dumps(r) for r in records], METRICS_LIMIT)

    def metrics(self, kind: str, last: int = METRICS_LIMIT) -> list[dict]:
        if last < 1:  # Redis reads LRANGE -0 -1 as the whole list
            return []
        return [json.loads(s) for s in self._call(self._metrics, kind, int(last))]

    # -- housekeeping -----------------------------------------------------------
    def clear(self, sessions=False, params=False, workers=False, metrics=False) -> None:
        """Delete what is asked; sessions take their layout along, everything takes the settings too."""
        what = {k for k, v in locals().items() if v is True}
        self._call(self._clear, what)

    def namespaces(self) -> list[str]:
        """Prefixes used in this database (some may hold no data: check before listing them)."""
        return sorted(self._call(self._namespaces))

    def close(self) -> None:
        """Release connections."""

    # -- what a backend implements: every one, each in one or two native calls ---
    def _is_transient(self, error: Exception) -> bool: ...  # server down, database locked: worth waiting out
    def _add(self, blobs: list[bytes], capacity: int) -> None: ...
    def _range(self) -> tuple[int, int]: ...
    def _get(self, ids: list[int]) -> dict[int, bytes]: ...
    def _delete(self, ids: list[int]) -> int: ...  # how many were there
    def _count(self) -> tuple[int, int]: ...
    def _set_meta(self, key: str, value: str | None, if_absent: bool) -> None: ...  # None: delete
    def _get_meta(self, key: str) -> str | None: ...
    def _incr_meta(self, key: str, n: int) -> int: ...
    def _save_params(self, blob: bytes, min_version: int, if_absent: bool, expect: int) -> int | None: ...
    def _load_params(self) -> tuple[int, bytes] | None: ...
    def _params_version(self) -> tuple[int, float] | None: ...
    def _heartbeat(self, worker_id: str, info: str, ttl: float) -> None: ...
    def _workers(self) -> list[str]: ...
    def _remove_worker(self, worker_id: str) -> None: ...
    def _add_metrics(self, kind: str, records: list[str], limit: int) -> None: ...
    def _metrics(self, kind: str, last: int) -> list[str]: ...
    def _clear(self, what: set[str]) -> None: ...
    def _namespaces(self) -> list[str]: ...
