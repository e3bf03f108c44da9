"""What a backend implements: a few primitives, each one or two native calls, that the database
(:class:`~tinyverse.database.base.Database`) runs through :meth:`Backend._call`, which waits out
an unreachable server and turns the backend's errors into one line."""

import abc
import itertools
import logging
import random
import re
import time
from collections.abc import Callable
from typing import Any

from ..errors import DatabaseError, command, masked
from ..every import Every
from .records import number

log = logging.getLogger(__name__)
PREFIX_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")  # a prefix names tables and keys


class Backend(abc.ABC):
    errors: tuple[type[Exception], ...] = ()  # the backend library's, turned into DatabaseError

    def __init__(self, url: str, prefix: str, retry_for: float | None):
        if not PREFIX_RE.fullmatch(prefix):
            raise DatabaseError(f"bad prefix {prefix!r}: use 1-64 letters, digits, '_', '.' or '-'")
        self.url = masked(url)
        self.prefix = prefix
        self.retry_for = retry_for  # seconds an outage is waited out (None: for ever)
        self.warn = Every(30.0)  # a warning a loop would repeat, said once in 30 s

    def _call(self, fn: Callable, *args: Any) -> Any:
        """Run a primitive, waiting out an unreachable database with backoff; backend errors
        become one line."""
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

    def _saved(self, version: Any, time: Any = 0, name=None) -> tuple[int, float]:
        """A params version (0: none stored) and save time as read back (of the snapshot ``name``);
        one line if junk."""
        what = f"the stored params of {self.prefix}'"
        what = what if name is None else f"snapshot {name!r:.70} of {self.prefix}'s"
        fix = f"delete them with {command('clear --del-params', self.prefix)}"
        version = number(version, int, f"{what} version", fix)
        return version, number(time, float, f"{what} time", fix)

    def _failure(self, error: Exception) -> str:
        """The line for an error that waiting will not cure."""
        return f"{type(self).__name__[:-8]} at {self.url}: {error} (check --db)"

    def _outage(self, error: Exception) -> tuple[str, str]:
        """What to log while waiting ``error`` out, and the line for a tool that waited enough."""
        fix = "start the server or pass --db sqlite:///tinyverse.db"
        waiting = f"database {self.url} unreachable ({error}); waiting with backoff"
        return waiting, f"cannot reach database {self.url} ({type(error).__name__}: {error}); {fix}"

    # -- the primitives: a backend lacking one cannot be made --------------------------------------
    @abc.abstractmethod
    def _is_transient(self, error: Exception) -> bool: ...  # server down, file locked: wait it out
    @abc.abstractmethod
    def _add(self, blobs: list[bytes], capacity: int) -> None: ...  # capacity stored unless one is
    @abc.abstractmethod
    def _range(self) -> tuple[int, int, int]: ...  # oldest, newest stored id; sessions ever added
    @abc.abstractmethod
    def _get(self, ids: list[int]) -> dict[int, bytes]: ...  # of distinct ids, at least one
    @abc.abstractmethod
    def _delete(self, ids: list[int]) -> int: ...  # how many were there
    @abc.abstractmethod
    def _set_meta(self, key: str, value: str | None, if_absent: bool) -> None: ...  # None: delete
    @abc.abstractmethod
    def _get_meta(self, key: str) -> Any: ...  # as stored: text, or junk
    @abc.abstractmethod
    def _incr_meta(self, key: str, n: int) -> Any: ...
    # version(the stored one, 0 if none): the version to write, None to write nothing; ``name``:
    # of the snapshot so named (None: the rolling params), as in _params
    @abc.abstractmethod
    def _save_params(self, blob: bytes, version: Callable, name=None) -> int | None: ...
    @abc.abstractmethod
    def _params(self, data: bool, name=None) -> tuple[int, float, bytes | None] | None: ...
    @abc.abstractmethod
    def _snapshots(self, limit: int) -> list[tuple[Any, Any, Any]]: ...  # (name, version, time)
    @abc.abstractmethod
    def _delete_snapshot(self, name: str) -> bool: ...  # whether it was there
    @abc.abstractmethod
    def _heartbeat(self, worker_id: str, info: str | None, ttl: float) -> None: ...  # None: gone
    @abc.abstractmethod
    def _workers(self) -> list[tuple[str, Any]]: ...  # (id, heartbeat) of each live worker
    @abc.abstractmethod
    def _add_metrics(self, kind: str, records: list[str], limit: int) -> None: ...
    @abc.abstractmethod
    def _metrics(self, kind: str, last: int) -> list[Any]: ...
    @abc.abstractmethod
    def _clear(self, what: set[str]) -> None: ...  # of sessions, params, workers, metrics, settings
    @abc.abstractmethod
    def _namespaces(self) -> list[str]: ...

    # -- built on them: a backend may do better ----------------------------------------------------
    def _rows(self, ids: list[int]) -> list[tuple[int, bytes]]:
        """``(id, record)`` of the stored ones of ``ids``, in order, repeats kept: one fetch."""
        ids = [int(i) for i in ids]
        found = self._get(sorted(set(ids))) if ids else {}  # HMGET of no fields: an error
        return [(i, found[i]) for i in ids if i in found]

    def _sample(self, n: int) -> list[tuple[int, bytes]] | None:
        """``(id, record)`` of ``n`` ids drawn uniformly from the stored range, the stored ones
        (None: none are stored), in two reads; Redis does it in one round trip."""
        lo, hi, _ = self._range()
        return None if hi < lo else self._rows(random.choices(range(lo, hi + 1), k=n))

    def close(self) -> None:  # noqa: B027 (optional: a backend may hold no connection)
        """Release connections."""
