"""Params exchange: players and eval follow the stored params, trainers resume from them and publish
deltas merged into them. Only :func:`resume` (and a push after a delete) stores params where none
are: never over trained ones."""

import fnmatch
import logging
import time

import numpy as np

from . import checks
from .encoding import differences, layout
from .errors import ParamsMismatch, command
from .experiment import Arrays

log = logging.getLogger(__name__)


def check_params(expected: Arrays, got: Arrays, where: str, fix: str | None = None) -> None:
    """Raise ParamsMismatch naming every array whose name, shape or dtype differs, and ``fix``."""
    if problems := differences(layout(expected), layout(got), "model wants"):
        fix = fix or f"use another --prefix, or delete them with: {command('clear --del-params')}"
        found = "; ".join(problems)
        raise ParamsMismatch(f"params in {where} do not fit this experiment ({found}); {fix}")


def check_stored(expected: Arrays, stored: Arrays, db) -> None:
    """:func:`check_params` of the params stored in ``db``, the fix naming its prefix."""
    fix = f"use another --prefix, or delete them with: {command('clear --del-params', db.prefix)}"
    check_params(expected, stored, f"database {db.url} (prefix {db.prefix})", fix)


def _load(exp, db) -> int | None:
    """Load the stored params into ``exp``; their version, or None when none are stored."""
    if (found := db.load_params()) is None:
        return None
    check_stored(checks.get_params(exp), found[1], db)
    checks.call("set_params", exp.set_params, found[1])
    return found[0]


def sync_params(exp, db, version: int | None, reseed: bool = False) -> int | None:
    """Load the stored params into ``exp`` unless their version is ``version``; return the version
    ``exp`` holds.
    With ``reseed``, store ``exp``'s params when none are stored (:func:`resume`)."""
    if (stored := db.params_version()) is None and reseed:
        return resume(exp, db)
    if stored is None or stored == version:
        return version
    return _load(exp, db) or version  # None: deleted in between


def resume(exp, db) -> int:
    """Load the stored params into ``exp``, or store ``exp``'s if there are none; their version."""
    while (version := _load(exp, db)) is None:  # another worker's may come between load and save
        checks.finite(params := checks.get_params(exp), "at the experiment's init: fix it")
        if (version := db.save_params(params, if_absent=True)) is not None:
            log.info("no params stored: stored these as version %d", version)
            return version
    log.info("resuming from params version %d", version)
    return version


class Publisher:
    """A trainer's publications: deltas merged into the stored params by compare-and-set, so N
    trainers' updates all land (Downpour SGD's parameter server; docs: usage). ``local`` names
    (globs, e.g. a target network) are this trainer's own; ``sync``: take the merged params after
    a push (None: once another trainer's push came in)."""

    def __init__(self, exp, db, sync: bool | None = None, local=()):
        self.exp = exp
        self.db = db
        self.sync = sync
        self.local = tuple(local)
        self.version = resume(exp, db)
        self.base = self.stored = self._params()  # what we pushed from, and what we know is stored
        self.pushes = 0
        self.conflicts = 0  # races lost
        self.seconds = 0.0  # spent pushing

    def _params(self) -> Arrays:
        return {k: np.array(v) for k, v in checks.get_params(self.exp).items()}  # copies: it trains

    def _mine(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, g) for g in self.local)

    def _merge(self, stored: Arrays, local: Arrays) -> Arrays:
        merged = dict(stored)
        for k, v in local.items():
            if self._mine(k) or v.dtype.kind not in "fiuc" or stored[k] is self.base[k]:
                merged[k] = v  # ours: local arrays, flags, and any array nobody else changed
            else:
                merged[k] = np.asarray(stored[k] + (v - self.base[k]), v.dtype)
        return merged

    def push(self) -> int:
        """Merge what was trained since the last push into the stored params; their version."""
        start = time.monotonic()
        local = self._params()
        fix = f"not published (v{self.version} stays); lower the learning rate"
        checks.finite(local, f"after update {self.exp.run.updates + 1} of the run: {fix}")
        while True:
            version, stored = self.version, self.stored
            if self.db.params_version() != version:  # another trainer pushed, or they were deleted
                version, stored = self.db.load_params() or (0, self.base)
                check_stored(local, stored, self.db)
            merged = self._merge(stored, local)
            saved = self.db.save_params(merged, self.version + 1, expect=version)
            if saved is not None:
                break
            self.conflicts += 1
        if self.sync or (self.sync is None and version not in (self.version, 0)):
            self.base = {**merged, **{k: v for k, v in local.items() if self._mine(k)}}
            copies = {k: v.copy() for k, v in self.base.items()}
            checks.call("set_params", self.exp.set_params, copies)
        else:
            self.base = local
        self.version, self.stored = saved, merged
        self.pushes += 1
        self.seconds += time.monotonic() - start
        return self.version
