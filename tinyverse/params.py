"""Params exchange between the experiment and the database, in one place.

Players and eval follow the stored params with :func:`sync_params`; trainers
publish what they trained through a :class:`Publisher`, as a delta merged into
the stored params, so several trainers add up instead of overwriting each other.
A player stores params only where none are (its random init at first, the latest
it knows after a delete), so stored params are never replaced by a random init.
"""

import fnmatch
import logging
import time

import numpy as np

from .database import Database
from .errors import ParamsMismatch, TinyverseError
from .experiment import Arrays, Experiment

log = logging.getLogger(__name__)


FIX = "use another --prefix, or delete them with: python -m tinyverse EXP clear --del-weights"


def check_params(expected: Arrays, got: Arrays, where: str, fix: str = FIX) -> None:
    """Raise ParamsMismatch naming every array whose name, shape or dtype differs, and ``fix``."""
    problems = [f"missing {k}" for k in expected.keys() - got.keys()]
    problems += [f"unexpected {k}" for k in got.keys() - expected.keys()]
    for k in expected.keys() & got.keys():
        a, b = np.asarray(expected[k]), got[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{k}: stored {b.dtype}{list(b.shape)}, model wants {a.dtype}{list(a.shape)}")
    if problems:
        raise ParamsMismatch(f"params in {where} do not fit this experiment ({'; '.join(sorted(problems))}); {fix}")


def _load(exp: Experiment, db: Database) -> int | None:
    """Load the stored params into ``exp``; their version, or None when none are stored."""
    found = db.load_params()
    if found is None:
        return None
    check_params(exp.get_params(), found[1], f"database {db.url} (prefix {db.prefix})")
    exp.set_params(found[1])
    return found[0]


def sync_params(exp: Experiment, db: Database, version: int | None, reseed: bool = False) -> int | None:
    """Load params into ``exp`` if the stored version differs from ``version``; return the version held.

    With ``reseed``, store the experiment's current params when none are stored
    (a random init at first, the latest known params after a delete).
    """
    stored = db.params_version()
    if stored is None:
        if reseed and (seeded := db.save_params(exp.get_params(), if_absent=True)) is not None:
            log.info("no params in the database: stored this player's (version %s) as version %d", version, seeded)
            return seeded
        return version
    if stored == version:
        return version
    loaded = _load(exp, db)
    return version if loaded is None else loaded  # None: deleted in between


def resume(exp: Experiment, db: Database) -> int:
    """A trainer's start: load the stored params, or store this random init if there are none."""
    while True:  # a player may store its init between our load and our save: then load that
        version = _load(exp, db)
        if version is not None:
            log.info("resuming from params version %d", version)
            return version
        version = db.save_params(exp.get_params(), if_absent=True)
        if version is not None:
            return version


class Publisher:
    """A trainer's publications, in the manner of Downpour SGD's parameter server.

    Dean et al. 2012, "Large Scale Distributed Deep Networks": each trainer
    adds ``coef`` x (its params - ``base``) to the stored params, ``base`` being
    the params it last loaded or pushed from, with a compare-and-set on the
    version (no lock: a lost race reloads and retries), so N trainers' updates
    all land. After a push a syncing trainer takes the merged params as its own
    (``sync`` None: as soon as it sees another trainer's push). Integer arrays
    merge exactly, like counters; ``local`` names (globs, e.g. a target network)
    are written as this trainer's own values and never taken from the others;
    ``only`` (globs) pushes those arrays only, keeping the stored rest.
    Optimizer state never leaves the trainer. One trainer alone stores exactly
    what it trained.
    """

    def __init__(self, exp: Experiment, db: Database, coef: float = 1.0, sync: bool | None = None, only=(), local=()):
        if not coef > 0:
            raise TinyverseError(f"--push-coef must be positive, got {coef}: 1 adds each trainer's updates whole")
        if coef > 1:
            log.warning("--push-coef %g above 1 scales every update up: learning may diverge", coef)
        self.exp, self.db, self.coef, self.sync = exp, db, coef, sync
        self.only, self.local = tuple(g for g in only if g), tuple(local)
        self.version = resume(exp, db)
        self.base = self.stored = self._params()  # what we pushed from, and what we know is stored
        self.pushes, self.conflicts, self.seconds = 0, 0, 0.0  # so far: pushes, races lost, time spent

    def _params(self) -> Arrays:
        return {k: np.array(v) for k, v in self.exp.get_params().items()}  # copies: the model trains on

    def _match(self, name: str, globs: tuple) -> bool:
        return any(fnmatch.fnmatchcase(name, g) for g in globs)

    def _merge(self, stored: Arrays, local: Arrays) -> Arrays:
        merged = dict(stored)
        for k, v in local.items():
            if self.only and not self._match(k, self.only):
                continue  # not ours to push: the stored value stays
            if (
                self._match(k, self.local)
                or v.dtype.kind not in "fiuc"
                or (self.coef == 1 and stored[k] is self.base[k])
            ):
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
                    if (saved := self.db.save_params(local, version + 1, if_absent=True)) is not None:
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
                mine = {k: v for k, v in local.items() if self._match(k, self.local)}
                self.base = {**merged, **mine}
                self.exp.set_params({k: v.copy() for k, v in self.base.items()})
            else:
                self.base = local
            self.version, self.stored = saved, merged
            break
        self.pushes, self.seconds = self.pushes + 1, self.seconds + time.monotonic() - start
        return self.version
