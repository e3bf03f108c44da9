"""The database's data plane, what experiments and loops exchange: sessions (a ring the players
append to, the trainers sample) and params (one versioned set; named snapshots: :mod:`.snapshots`).
The control plane beside it (settings, counters, workers, metrics): :mod:`.control`; how each
backend stores them: docs/database.rst."""

import logging
from typing import NamedTuple

import numpy as np

from ..encoding import decode, decode_batch, differences, encode, layout
from ..errors import RecordError, TinyverseError, command
from .records import checked
from .snapshots import Snapshots

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]
BUDGET = 2**30  # bytes of sessions kept unless a capacity is stored: 1,000 to 10^6 sessions


class Counts(NamedTuple):
    stored: int  # sessions stored now (removed corrupt ones count until evicted)
    added: int  # sessions ever added


class Saved(NamedTuple):
    version: int
    time: float  # Unix time of the save


class Database(Snapshots):
    """Sessions and params of one namespace (and, from ``control.Control``, its settings,
    counters, workers and metrics)."""

    # -- sessions ----------------------------------------------------------------------------------
    def add_sessions(self, sessions: list[Arrays], capacity: int | None = None) -> None:
        """Append sessions atomically, evicting the oldest; the first append stores their layout
        and the capacity (``capacity``, else what fits ``BUDGET``) unless one is stored."""
        if not sessions:
            return
        if self.layout != (mine := layout(sessions[0])):
            if (stored := self.claim("layout", mine)) not in (mine, None):  # None: cleared since
                found = "; ".join(differences(mine, stored, "this experiment records"))
                fix = f"use another --prefix, or delete them with {self._clear_sessions}"
                layouts = f"sessions of another layout ({found or 'another order'})"
                raise TinyverseError(f"prefix {self.prefix} holds {layouts}: {fix}")
            self.layout = mine
        size = sum(np.asarray(a).nbytes for a in sessions[0].values())
        default = capacity or int(min(10**6, max(1000, BUDGET // max(size, 1))))
        blobs = [encode(s) for s in sessions]
        self._call(self._add, blobs, checked("capacity", default, "buffer size"))

    def sample_batch(self, n: int) -> Arrays:
        """``n`` sessions drawn uniformly, stacked as by :meth:`get_batch`; fewer when some were
        skipped."""
        rows: list[tuple[int, bytes]] = []
        for _ in range(10):  # ids evicted or removed meanwhile (none stored: None) are drawn again
            if len(rows) >= n or (drawn := self._call(self._sample, n - len(rows))) is None:
                break
            rows += drawn
        return self._batch(rows)

    def get_batch(self, ids: list[int]) -> Arrays:
        """The stored ones of ``ids`` in order (repeats kept), stacked into ``{name: (k, ...)}``
        arrays with ``id``."""
        return self._batch(self._call(self._rows, ids))

    def _batch(self, rows: list[tuple[int, bytes]]) -> Arrays:
        """Decode, skipping sessions of another layout and deleting corrupt ones for good
        (counted, warned)."""
        if rows and self.layout is None:
            self.layout = self.setting("layout")
        batch, kept, errors = decode_batch([blob for _, blob in rows], self.layout)
        if errors:
            bad = sorted({rows[j][0] for j, _ in errors})
            if removed := self._call(self._delete, bad):  # another process may have removed some
                self.add_to_counter("corrupt", removed)
            if self.warn("corrupt"):
                said = "removed %d corrupt sessions from %s (%s)"
                log.warning(said, len(bad), self.prefix, errors[0][1])
        if len(kept) + len(errors) < len(rows):
            self.layout = None  # cleared and refilled? the next batch reads the layout again
            if self.warn("layout"):
                fix = f"delete them with {self._clear_sessions}, or use another --prefix"
                log.warning("skipped sessions of another layout in %s: %s", self.prefix, fix)
        if batch:
            batch["id"] = np.array([rows[j][0] for j in kept], np.int64)
        return batch

    @property
    def _clear_sessions(self) -> str:
        return command("clear --del-sessions", self.prefix)

    def session_range(self) -> tuple[int, int]:
        """(oldest, newest) stored id; newest < oldest when none are stored."""
        return self._call(self._range)[:2]

    def count_sessions(self) -> Counts:
        lo, hi, added = self._call(self._range)
        return Counts(max(hi - lo + 1, 0), added)

    def env_steps(self, session_length: int) -> int:
        """Env steps played into this namespace: its sessions ever added, ``session_length``
        ticks each."""
        return self.count_sessions().added * session_length

    # -- params ------------------------------------------------------------------------------------
    def save_params(self, params: Arrays, min_version=0, if_absent=False, expect=None):
        """Store params with version max(stored + 1, min_version) and return it; None: not written
        (``if_absent`` and params are stored, or ``expect`` given and the stored version is
        another: a compare-and-set)."""
        expect = 0 if if_absent else expect  # version 0: none stored

        def version(stored: int) -> int | None:  # what to write over the stored one; None: nothing
            return None if expect not in (None, stored) else max(stored + 1, min_version)

        return self._call(self._save_params, encode(params), version)

    def load_params(self, name: str | None = None) -> tuple[int, Arrays] | None:
        """(version, params) or None when none are stored; of the snapshot ``name`` if given (by
        version too: :meth:`find_params`)."""
        if (found := self._call(self._params, True, name)) is None:
            return None
        try:
            return found[0], decode(found[2])
        except RecordError as e:
            fix = f"delete them with {command('clear --del-params', self.prefix)}"
            fix += " (trainers then start from a random init)"
            what = "the stored params" if name is None else f"snapshot {name!r:.70}"
            raise RecordError(f"{what} of {self.prefix}: {e}; {fix}") from None

    def params_version(self) -> int | None:
        """The stored params' version; None if none are stored."""
        return None if (saved := self.params_saved()) is None else saved.version

    def params_saved(self) -> Saved | None:
        """The stored params' version and when they were saved; None if none are stored."""
        found = self._call(self._params, False)
        return None if found is None else Saved(*found[:2])
