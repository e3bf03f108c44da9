"""What an experiment declares, checked before anything is stored (options may set it): its
settings, the pace's among them, and a trainer's batch against the memory available."""

import math
import numbers

import numpy as np
import psutil

from .errors import ExperimentError

PACE = ("updates_per_step", "learning_starts", "pace_slack")


def _whole(v, least: int, most: float = math.inf) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool) and least <= v <= most


def _rate(v) -> bool:
    return v is None or isinstance(v, numbers.Real) and not isinstance(v, bool) and 0 < v < math.inf


def _globs(v) -> bool:
    return isinstance(v, tuple | list) and all(isinstance(glob, str) for glob in v)


SETTINGS = {  # what the loops need of each setting, in words and as a test
    "session_length": ("a whole number from 1 to 100,000", lambda v: _whole(v, 1, 100_000)),
    "play_batch_size": ("a whole number >= 1", lambda v: _whole(v, 1)),
    "train_batch_size": ("a whole number >= 1", lambda v: _whole(v, 1)),
    "buffer_size": ("None or a whole number >= 1", lambda v: v is None or _whole(v, 1)),
    "prefetch": ("a whole number >= 0", lambda v: _whole(v, 0)),
    "save_every": ("a whole number >= 1", lambda v: _whole(v, 1)),
    "keep_last": ("a whole number from 0 to 50", lambda v: _whole(v, 0, 50)),
    "keep_every": ("a whole number >= 0", lambda v: _whole(v, 0)),
    "batch_per_player": ("True or False", lambda v: isinstance(v, bool)),
    "local_params": ("a tuple of globs", _globs),
    "updates_per_step": ("None or a number > 0", _rate),
    "learning_starts": ("a whole number >= 0", lambda v: _whole(v, 0)),
    "pace_slack": ("a whole number >= 0", lambda v: _whole(v, 0)),
}


def check(exp):
    """The experiment's settings (``exp.run.settings``), checked: one line naming a setting the
    loops cannot run with."""
    settings = exp.run.settings
    for name, (want, fits) in SETTINGS.items():
        if not fits(value := getattr(settings, name)):
            fix = f"not {want}: fix the experiment file, or the --set option it comes from"
            pace = "bad pace: " if name in PACE else ""
            raise ExperimentError(f"{pace}the experiment's {name} is {value!r}, {fix}")
    return settings


def batch_fits(db, batch_size: int) -> bool:
    """Refuse a batch of ``batch_size`` sessions over half the memory available, a session's bytes
    known from the stored layout; False while none is stored."""
    try:
        each = sum(math.prod(s) * np.dtype(d).itemsize for _, d, s in db.setting("layout"))
    except (TypeError, ValueError):  # none stored yet, or no layout (decoding refuses those)
        each = 0
    if each and batch_size * each > (available := psutil.virtual_memory().available) // 2:
        need = f"{batch_size:,} sessions of {each:,} bytes, {batch_size * each / 2**30:,.1f} GiB"
        fix = f"over half the {available / 2**30:.1f} GiB available: lower train -b"
        raise ExperimentError(f"a batch of {need}, is {fix} to {available // 2 // each:,} or less")
    return each > 0
