"""Params exchange between the experiment and the database, in one place.

Players and eval follow the stored params with :func:`sync_params`; trainers
publish what they trained through a :class:`Publisher`, as a delta merged into
the stored params, so several trainers add up instead of overwriting each other.
Params are stored where none are only by :func:`seed` (a random init at first,
the latest known params after a delete), so trained params are never replaced.
"""

import fnmatch
import logging
import time

import numpy as np

from .database import Database
from .errors import ParamsMismatch, TinyverseError, command
from .experiment import Arrays, Experiment

log = logging.getLogger(__name__)


def check_params(expected: Arrays, got: Arrays, where: str, fix: str | None = None) -> None:
    """Raise ParamsMismatch naming every array whose name, shape or dtype differs, and ``fix``."""
    problems = [f"missing {k}" for k in expected.keys() - got.keys()]
    problems += [f"unexpected {k}" for k in got.keys() - expected.keys()]
    for k in expected.keys() & got.keys():
        a, b = np.asarray(expected[k]), got[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{k}: stored {b.dtype}{list(b.shape)}, model wants {a.dtype}{list(a.shape)}")
    if problems:
        fix = fix or f"use another --prefix, or delete them with: {command('clear --del-weights')}"
        raise ParamsMismatch(f"params in {where} do not fit this experiment ({'; '.join(sorted(problems))}); {fix}")


def seed(db: Database, params: Arrays, min_version: int = 0) -> int | None:
    """Store ``params`` if none are stored; their version, or None when some were."""
    return db.save_params(params, min_version, if_absent=True)


def _load(exp: Experiment, db: Database) -> int | None:
    """Load the stored params into ``exp``; their version, or None when none are stored."""
    if (found := db.load_params()) is None:
        return None
    check_params(exp.get_params(), found[1], f"database {db.url} (prefix {db.prefix})")
    exp.set_params(found[1])
    return found[0]


def sync_params(exp: Experiment, db: Database, version: int | None, reseed: bool = False) -> int | None:
    """Load params into ``exp`` if the stored version differs from ``version``; return the version held.

    With ``reseed``, store the experiment's params when none are stored.
    """
    if (stored := db.params_version()) == version and version is not None:
        return version
    if stored is None:
        if reseed and (seeded := seed(db, exp.get_params())) is not None:
            log.info("no params in the database: stored this player's (version %s) as version %d", version, seeded)
            return seeded
        return version
    loaded = _load(exp, db)
    return version if loaded is None else loaded  # None: deleted in between


def resume(exp: Experiment, db: Database) -> int:
    """A trainer's start: load the stored params, or store this random init if there are none."""
    while (version := _load(exp, db)) is None:  # a player may store its init between our load and our seed
        if (version := seed(db, exp.get_params())) is not None:
            return version
    log.info("resuming from params version %d", version)
    return version


class Publisher:
    """A trainer's publications, in the manner of Downpour SGD's parameter server.

    Dean et al. 2012, "Large Scale Distributed Deep Networks": each trainer adds
    ``coef`` x (its params - ``base``, the params it last loaded or pushed from) to the
    stored params, with a compare-and-set on the version (no lock: a lost race
    reloads and retries), so N trainers' updates all land. After a push a
    syncing trainer takes the merged params as its own (``sync`` None: as soon
    as it sees another trainer's push). Integer arrays merge exactly, like
    counters; ``local`` names (globs, e.g. a target network) are written as this
    trainer's own values and never taken from the others. Optimizer state never
    leaves the trainer. One trainer alone stores exactly what it trained.
    """

    def __init__(self, exp: Experiment, db: Database, sync: bool | None = None, local=(), coef: float = 1.0):
        if not coef > 0:
            raise TinyverseError(f"--push-coef must be positive, got {coef}: 1 adds each trainer's updates whole")
        if coef > 1:
            log.warning("--push-coef %g above 1 scales every update up: learning may diverge", coef)
        self.exp, self.db, self.sync, self.local, self.coef = exp, db, sync, tuple(local), coef
        self.version = resume(exp, db)
        self.base = self.stored = self._params()  # what we pushed from, and what we know is stored
        self.pushes, self.conflicts, self.seconds = 0, 0, 0.0  # so far: pushes, races lost, time spent

    def _params(self) -> Arrays:
        return {k: np.array(v) for k, v in self.exp.get_params().items()}  # copies: the model trains on

    def _mine(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, g) for g in self.local)

    def _merge(self, stored: Arrays, local: Arrays) -> Arrays:
        merged = dict(stored)
        for k, v in local.items():
            if self._mine(k) or v.dtype.kind not in "fiuc" or (self.coef == 1 and stored[k] is self.base[k]):
                merged[k] = v  # our own value: local arrays, flags, and any array nobody else changed
            else:
                new = np.asarray(stored[k] + self.coef * (v - self.base[k]))
                merged[k] = (np.rint(new) if v.dtype.kind in "iu" else new).astype(v.dtype)
        return merged

    def push(self) -> int:
        """Merge what was trained since the last push into the stored params; return their version."""
        start, local = time.monotonic(), self._params()
        while True:
            version, stored = self.version, self.stored
            if self.db.params_version() != version:  # another trainer pushed, or params were deleted
                if (found := self.db.load_params()) is None:  # deleted: ours start afresh, as a new version
                    if (saved := seed(self.db, local, version + 1)) is not None:
                        self.version, self.base, self.stored = saved, local, dict(local)
                        break
                    continue
                version, stored = found
                check_params(local, stored, f"database {self.db.url} (prefix {self.db.prefix})")
            merged = self._merge(stored, local)
            if (saved := self.db.save_params(merged, expect=version)) is None:
                self.conflicts += 1
                continue
            if self.sync or (self.sync is None and version != self.version):
                self.base = {**merged, **{k: v for k, v in local.items() if self._mine(k)}}
                self.exp.set_params({k: v.copy() for k, v in self.base.items()})
            else:
                self.base = local
            self.version, self.stored = saved, merged
            break
        self.pushes, self.seconds = self.pushes + 1, self.seconds + time.monotonic() - start
        return self.version
