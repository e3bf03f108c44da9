"""What a backend implements: a few primitives, each one or two native calls, that :class:`Database` runs through
:meth:`Backend._call`, which waits out an unreachable server and turns the backend's errors into one line."""

import itertools
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from ..errors import DatabaseError, masked

log = logging.getLogger(__name__)
PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # a prefix names tables and keys


class Backend:
    errors: tuple[type[Exception], ...] = ()  # the backend library's errors, turned into DatabaseError

    def __init__(self, url: str, prefix: str, retry_for: float | None):
        if not PREFIX_RE.match(prefix):
            raise DatabaseError(f"bad prefix {prefix!r}: use 1-64 letters, digits, '_', '.' or '-'")
        self.url, self.prefix, self.retry_for = masked(url), prefix, retry_for

    def _call(self, fn: Callable, *args: Any) -> Any:
        """Run a primitive, waiting out an unreachable database with backoff; backend errors become one line."""
        start = time.monotonic()
        for attempt in itertools.count():
            try:
                result = fn(*args)
                break
            except self.errors as e:
                if not self._is_transient(e):
                    raise DatabaseError(f"{type(self).__name__[:-8]} at {self.url}: {e} (check --db)") from None
                if self.retry_for is not None and time.monotonic() - start >= self.retry_for:
                    fix = "start the server or pass --db sqlite:///tinyverse.db"
                    raise DatabaseError(f"cannot reach database {self.url} ({type(e).__name__}: {e}); {fix}") from None
                if attempt == 0:
                    log.warning("database %s unreachable (%s); waiting with backoff", self.url, e)
                time.sleep(min(0.2 * 2**attempt, 10.0))
        if attempt:
            log.warning("database %s is back", self.url)
        return result

    def _rows(self, ids: list[int]) -> list[tuple[int, bytes]]:
        """``(id, record)`` of the stored ones of ``ids``, in order, repeats kept: one fetch."""
        ids = [int(i) for i in ids]
        found = self._get(sorted(set(ids))) if ids else {}  # HMGET of no fields is an error in Redis
        return [(i, found[i]) for i in ids if i in found]

    def namespaces(self) -> list[str]:
        """Prefixes used in this database (some may hold no data: check before listing them)."""
        return sorted(self._call(self._namespaces))

    # -- the primitives -------------------------------------------------------------------------------------------
    def _is_transient(self, error: Exception) -> bool: ...  # server down, database locked: worth waiting out
    def _add(self, blobs: list[bytes], capacity: int) -> None: ...  # capacity: stored if none is; then evict
    def _range(self) -> tuple[int, int, int]: ...  # oldest and newest stored id, sessions ever added
    def _get(self, ids: list[int]) -> dict[int, bytes]: ...  # of distinct ids, at least one
    def _delete(self, ids: list[int]) -> int: ...  # how many were there
    def _set_meta(self, key: str, value: str | None, if_absent: bool) -> None: ...  # None: delete
    def _get_meta(self, key: str) -> str | None: ...
    def _incr_meta(self, key: str, n: int) -> int: ...
    def _save_params(self, blob: bytes, version: Callable[[int], int | None]) -> int | None: ...  # stored: 0 if none
    def _params(self, data: bool) -> tuple[int, float, bytes | None] | None: ...  # version, time, data if asked
    def _heartbeat(self, worker_id: str, info: str | None, ttl: float) -> None: ...  # None: forget the worker
    def _workers(self) -> list[str]: ...
    def _add_metrics(self, kind: str, records: list[str], limit: int) -> None: ...
    def _metrics(self, kind: str, last: int) -> list[str]: ...
    def _clear(self, what: set[str]) -> None: ...  # sessions (and the layout), params, workers, metrics, settings
    def _namespaces(self) -> list[str]: ...

    def close(self) -> None:
        """Release connections."""
