"""What a backend implements: a few primitives, each one or two native calls, that :class:`Database` runs through
:meth:`Backend._call`, which waits out an unreachable server and turns the backend's errors into one line."""

import contextlib
import itertools
import json
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from ..encoding import check_layout
from ..errors import DatabaseError, command, masked
from ..every import Every

log = logging.getLogger(__name__)
PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # a prefix names tables and keys

# What the primitives read back is parsed before use: any machine that can write to the database may
# have written anything there.
MAX_JSON = 2**20  # characters of a JSON text read back (a setting, heartbeat, metric): more is junk
# what tinyverse stores under these settings (any other value is refused); other keys: any JSON
KINDS = {"capacity": int, "updates": int, "corrupt": int, "options": dict, "defaults": dict}
KINDS |= {"layout": list}


def number(value: Any, kind: type, what: str, fix: str, low: int = 0) -> Any:
    """``value`` (a number, or its text as read back) as ``kind``, int or float, from ``low`` to
    2^53; else one line naming ``what`` and ``fix``. Bools are no numbers, NaN is out of range."""
    if isinstance(value, bytes | str) and len(value) <= 40:
        with contextlib.suppress(ValueError):
            value = kind(value)
    if type(value) in (kind, int) and low <= value <= 2**53:
        return kind(value)
    noun = "whole number" if kind is int else "number"
    raise DatabaseError(f"{what} is {value!r:.40}, not a {noun} in {low}..2^53: {fix}")


def loads(text: Any) -> Any:
    """JSON read back, parsed within bounds; ValueError for anything else."""
    if not isinstance(text, bytes | str) or len(text) > MAX_JSON:
        raise ValueError(f"not JSON text of at most {MAX_JSON:,} characters")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def checked(key: str, value: Any, what: str, fix: str = "nothing was stored") -> Any:
    """``value`` if it is what tinyverse stores under ``key`` (:data:`KINDS`), else one line."""
    if KINDS.get(key) is int and not isinstance(value, str):  # a count, never its text
        return number(value, int, what, fix, int(key == "capacity"))
    try:
        if key == "layout":
            check_layout(value)
        if isinstance(value, KINDS.get(key, object)):
            return value
    except (TypeError, ValueError):
        pass
    raise DatabaseError(f"{what} is {value!r:.60}, which tinyverse does not store there: {fix}")


class Backend:
    errors: tuple[type[Exception], ...] = ()  # the backend library's errors, turned into DatabaseError

    def __init__(self, url: str, prefix: str, retry_for: float | None):
        if not PREFIX_RE.fullmatch(prefix):
            raise DatabaseError(f"bad prefix {prefix!r}: use 1-64 letters, digits, '_', '.' or '-'")
        self.url, self.prefix, self.retry_for = masked(url), prefix, retry_for
        self.warn = Every(30.0)  # a warning a loop would repeat, said once in 30 s

    def _call(self, fn: Callable, *args: Any) -> Any:
        """Run a primitive, waiting out an unreachable database with backoff; backend errors become one line."""
        start = time.monotonic()
        for attempt in itertools.count():
            try:
                result = fn(*args)
                break
            except self.errors as e:
                if not self._is_transient(e):
                    raise DatabaseError(self._failure(e)) from None
                waiting, given_up = self._outage(e)
                if self.retry_for is not None and time.monotonic() - start >= self.retry_for:
                    raise DatabaseError(given_up) from None
                if attempt == 0:
                    log.warning("%s", waiting)
                time.sleep(min(0.2 * 2**attempt, 10.0))
        if attempt:
            log.warning("database %s is back", self.url)
        return result

    @property
    def junk(self) -> str:
        """How to get rid of what tinyverse did not write under this prefix."""
        return f"delete it with {command('clear --all', self.prefix)}, or use another --prefix"

    def _saved(self, version: Any, time: Any = 0) -> tuple[int, float]:
        """A params version (0: none stored) and save time as read back; one line if junk."""
        what = f"the stored params of {self.prefix}"
        fix = f"delete them with {command('clear --del-params', self.prefix)}"
        version = number(version, int, f"{what}' version", fix)
        return version, number(time, float, f"{what}' time", fix)

    def _failure(self, error: Exception) -> str:
        """The line for an error that waiting will not cure."""
        return f"{type(self).__name__[:-8]} at {self.url}: {error} (check --db)"

    def _outage(self, error: Exception) -> tuple[str, str]:
        """What to log while waiting ``error`` out, and the line for a tool that waited enough."""
        fix = "start the server or pass --db sqlite:///tinyverse.db"
        waiting = f"database {self.url} unreachable ({error}); waiting with backoff"
        return waiting, f"cannot reach database {self.url} ({type(error).__name__}: {error}); {fix}"

    def _rows(self, ids: list[int]) -> list[tuple[int, bytes]]:
        """``(id, record)`` of the stored ones of ``ids``, in order, repeats kept: one fetch."""
        ids = [int(i) for i in ids]
        found = self._get(sorted(set(ids))) if ids else {}  # HMGET of no fields is an error in Redis
        return [(i, found[i]) for i in ids if i in found]

    def namespaces(self) -> list[str]:
        """Prefixes used in this database (some may hold no data: check before listing them)."""
        found = self._call(self._namespaces)
        return sorted(p for p in found if isinstance(p, str) and PREFIX_RE.fullmatch(p))  # not junk

    # -- the primitives -------------------------------------------------------------------------------------------
    def _is_transient(self, error: Exception) -> bool: ...  # server down, database locked: worth waiting out
    def _add(self, blobs: list[bytes], capacity: int) -> None: ...  # capacity: stored if none is; then evict
    def _range(self) -> tuple[int, int, int]: ...  # oldest and newest stored id, sessions ever added
    def _get(self, ids: list[int]) -> dict[int, bytes]: ...  # of distinct ids, at least one
    def _delete(self, ids: list[int]) -> int: ...  # how many were there
    def _set_meta(self, key: str, value: str | None, if_absent: bool) -> None: ...  # None: delete
    def _get_meta(self, key: str) -> Any: ...  # as stored: text, or junk
    def _incr_meta(self, key: str, n: int) -> Any: ...
    def _save_params(self, blob: bytes, version: Callable[[int], int | None]) -> int | None: ...  # stored: 0 if none
    def _params(self, data: bool) -> tuple[int, float, bytes | None] | None: ...  # version, time, data if asked
    def _heartbeat(self, worker_id: str, info: str | None, ttl: float) -> None: ...  # None: forget the worker
    def _workers(self) -> list[tuple[str, Any]]: ...  # (id, heartbeat) of each live worker
    def _add_metrics(self, kind: str, records: list[str], limit: int) -> None: ...
    def _metrics(self, kind: str, last: int) -> list[Any]: ...
    def _clear(self, what: set[str]) -> None: ...  # sessions (and the layout), params, workers, metrics, settings
    def _namespaces(self) -> list[str]: ...

    def close(self) -> None:
        """Release connections."""
