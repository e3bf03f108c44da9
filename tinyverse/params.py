"""Params exchange between the experiment and the database, in one place.

Players and eval follow the stored params with :func:`sync_params`; a trainer
starts with :func:`resume` and is the only process that publishes what it
trained (``db.save_params``). A player stores params only where none are (its
random init at first, the latest it knows after a delete), so stored params are
never replaced by a random init.
"""

import logging

import numpy as np

from .database import Database
from .errors import ParamsMismatch
from .experiment import Arrays, Experiment

log = logging.getLogger(__name__)


def check_params(expected: Arrays, got: Arrays, where: str) -> None:
    """Raise ParamsMismatch naming every array whose name, shape or dtype differs."""
    problems = [f"missing {k}" for k in expected.keys() - got.keys()]
    problems += [f"unexpected {k}" for k in got.keys() - expected.keys()]
    for k in expected.keys() & got.keys():
        a, b = np.asarray(expected[k]), got[k]
        if a.shape != b.shape or a.dtype != b.dtype:
            problems.append(f"{k}: stored {b.dtype}{list(b.shape)}, model wants {a.dtype}{list(a.shape)}")
    if problems:
        raise ParamsMismatch(
            f"params in {where} do not fit this experiment ({'; '.join(sorted(problems))}); "
            "use another --prefix, or delete them with: python -m tinyverse EXP clear --del-weights"
        )


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
