"""The database that players, trainers and tools share (docs/database.rst), on the primitives of a backend."""

import json
import logging
import random
from typing import Any, NamedTuple

import numpy as np

from ..encoding import decode, decode_batch, differences, encode, layout
from ..errors import DatabaseError, RecordError, TinyverseError, command
from .backend import checked, loads, number
from .fleet import Fleet

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]
BUDGET = 2**30  # bytes of sessions kept unless a capacity is stored: 1,000 to 10^6 sessions


class Counts(NamedTuple):
    stored: int  # sessions stored now (removed corrupt ones count until evicted)
    added: int  # sessions ever added


class Saved(NamedTuple):
    version: int
    time: float  # Unix time of the save


class Database(Fleet):
    """Sessions, params, settings, workers and metrics of one namespace."""

    def __init__(self, url: str, prefix: str = "tinyverse", retry_for: float | None = None):
        super().__init__(url, prefix, retry_for)
        self.layout: list | None = None  # of the sessions stored: those of another layout are never handed out

    def add_sessions(self, sessions: list[Arrays], capacity: int | None = None) -> None:
        """Append sessions atomically, evicting the oldest; the first append claims their layout and the capacity."""
        if not sessions:
            return
        if self.layout != (mine := layout(sessions[0])):
            if (stored := self.claim("layout", mine)) not in (mine, None):  # None: cleared since the claim
                found = "; ".join(differences(mine, stored, "this experiment records")) or "another order"
                fix = f"use another --prefix, or delete them with {command('clear --del-sessions', self.prefix)}"
                raise TinyverseError(f"prefix {self.prefix} holds sessions of another layout ({found}): {fix}")
            self.layout = mine
        size = sum(np.asarray(a).nbytes for a in sessions[0].values())
        default = capacity or int(min(10**6, max(1000, BUDGET // max(size, 1))))
        blobs = [encode(s) for s in sessions]
        self._call(self._add, blobs, checked("capacity", default, "buffer size"))

    def sample_batch(self, n: int) -> Arrays:
        """``n`` sessions drawn uniformly, stacked as by :meth:`get_batch`; fewer when some were skipped."""
        rows: list[tuple[int, bytes]] = []
        for _ in range(10):  # ids evicted or removed between reading the range and the rows are redrawn
            lo, hi = self.session_range()
            if hi < lo or n < 1:
                break
            rows += self._call(self._rows, [random.randint(lo, hi) for _ in range(n - len(rows))])
            if len(rows) == n:
                break
        return self._batch(rows)

    def get_batch(self, ids: list[int]) -> Arrays:
        """The stored ones of ``ids`` in order (repeats kept), stacked into ``{name: (k, ...)}`` arrays with ``id``."""
        return self._batch(self._call(self._rows, ids))

    def _batch(self, rows: list[tuple[int, bytes]]) -> Arrays:
        """Decode, skipping sessions of another layout and deleting corrupt ones for good (counted, warned)."""
        if rows and self.layout is None:
            self.layout = self.setting("layout")
        batch, kept, errors = decode_batch([blob for _, blob in rows], self.layout)
        if errors:
            bad = sorted({rows[j][0] for j, _ in errors})
            if removed := self._call(self._delete, bad):  # another process may have removed some first
                self.add_updates(removed, "corrupt")
            if self.warn("corrupt"):
                log.warning("removed %d corrupt sessions from %s (%s)", len(bad), self.prefix, errors[0][1])
        if len(kept) + len(errors) < len(rows):
            self.layout = None  # cleared and refilled with other sessions? the next batch reads the layout again
            if self.warn("layout"):
                fix = f"delete them with {command('clear --del-sessions', self.prefix)}, or use another --prefix"
                log.warning("skipped sessions of another layout in %s: %s", self.prefix, fix)
        if batch:
            batch["id"] = np.array([rows[j][0] for j in kept], np.int64)
        return batch

    def session_range(self) -> tuple[int, int]:
        """(oldest, newest) stored id; newest < oldest when none are stored."""
        return self._call(self._range)[:2]

    def count_sessions(self) -> Counts:
        lo, hi, added = self._call(self._range)
        return Counts(max(hi - lo + 1, 0), added)

    def set_capacity(self, capacity: int) -> None:
        """Keep at most ``capacity`` sessions from now on, for every worker, evicting the oldest now."""
        capacity = checked("capacity", capacity, "buffer size")
        if (old := self.capacity()) not in (None, capacity):
            log.warning("buffer size of %s: %d sessions, was %d (for every worker)", self.prefix, capacity, old)
        self._call(self._set_meta, "capacity", str(capacity), False)
        self._call(self._add, [], capacity)  # an append of nothing evicts

    def capacity(self) -> int | None:
        return self.setting("capacity")

    def claim(self, key: str, value: Any) -> Any:
        """Store ``value`` (as JSON) under ``key`` unless one is stored; return the stored one."""
        value = checked(key, value, f"setting {key!r} to store")  # before it is stored, never after
        self._call(self._set_meta, key, json.dumps(value), True)
        return self.setting(key)

    def setting(self, key: str) -> Any:
        """The JSON value :meth:`claim` stored under ``key``, or None; one line if it is junk."""
        what = f"setting {key!r} of prefix {self.prefix}"
        try:
            text = self._call(self._get_meta, key)
            return None if text is None else checked(key, loads(text), what, self.junk)
        except ValueError:
            raise DatabaseError(f"{what} is not JSON: {self.junk}") from None

    def add_updates(self, n: int, name: str = "updates") -> int:
        """Add ``n`` to a counter (trainer "updates", the pace's; "corrupt" records removed); return the total."""
        total = self._call(self._incr_meta, name, int(n))
        return number(total, int, f"counter {name!r} of prefix {self.prefix}", self.junk)

    def counter(self, name: str) -> int:
        return self.setting(name) or 0

    def save_params(
        self, params: Arrays, min_version: int = 0, if_absent: bool = False, expect: int | None = None
    ) -> int | None:
        """Store params with version max(stored + 1, min_version) and return it; None: not written (``if_absent``
        and params are stored, or ``expect`` given and the stored version is another: a compare-and-set)."""
        expect = 0 if if_absent else expect  # version 0: none stored

        def version(stored: int) -> int | None:  # what to write over the stored version; None: nothing
            return None if expect not in (None, stored) else max(stored + 1, min_version)

        return self._call(self._save_params, encode(params), version)

    def load_params(self) -> tuple[int, Arrays] | None:
        """(version, params) or None when none are stored."""
        if (found := self._call(self._params, True)) is None:
            return None
        try:
            return found[0], decode(found[2])
        except RecordError as e:
            fix = f"delete them with {command('clear --del-params', self.prefix)} (a trainer then starts from a random init)"
            raise RecordError(f"the stored params of {self.prefix} are {e}; {fix}") from None

    def params_version(self) -> int | None:
        """The stored params' version; None if none are stored."""
        return None if (saved := self.params_saved()) is None else saved.version

    def params_saved(self) -> Saved | None:
        """The stored params' version and when they were saved; None if none are stored."""
        return None if (found := self._call(self._params, False)) is None else Saved(*found[:2])

    def clear(self, sessions=False, params=False, workers=False, metrics=False) -> None:
        """Delete what is asked; sessions take their layout along, everything the settings and counters too."""
        what = {k for k, v in locals().items() if v is True}
        if len(what) == 4:  # a fresh start: settings and counters too, but for stop requests
            what.add("settings")
        self._call(self._clear, what)
        self.layout = None
