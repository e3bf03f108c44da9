"""The core's settings (:class:`Settings`), which an experiment's options inherit, and what the core
knows of a run (:class:`Run`), which the experiment reads as ``self.run``."""

import dataclasses

from .errors import ExperimentError


@dataclasses.dataclass
class Settings:
    """The core's settings and their defaults: an experiment's options dataclass inherits them
    (``class Args(tinyverse.Settings)``) and overrides the defaults it wants, and ``--set`` sets
    one like any option. ``tinyverse/declared.py`` checks them."""

    session_length: int = 25
    """ticks per recorded session (sessions may cross episode boundaries)"""
    buffer_size: int | None = None
    """sessions the database keeps unless it keeps a number already (None: 1 GiB's)"""
    play_batch_size: int = 1
    """default of play -b: environments each player runs at once"""
    train_batch_size: int = 32
    """default of train -b: sessions in a minibatch, the unit the run's updates are counted in"""
    batch_per_player: bool = False
    """train -b is per live player: more players, larger updates"""
    prefetch: int = 2
    """batches sampled ahead in a background thread (0: in the training thread)"""
    save_every: int = 100
    """default of train -s: updates between publications of params"""
    keep_last: int = 0
    """snapshots vN trainers keep of the newest params versions (a league: 3)"""
    keep_every: int = 100
    """and of every version that is a multiple of this (0: none)"""
    local_params: tuple[str, ...] = ()
    """params (globs) each trainer keeps its own of, e.g. a target network: ("target.*",)"""
    updates_per_step: float | None = None
    """the pace: trainer updates per env step played (None: no pace)"""
    learning_starts: int = 0
    """the pace: env steps played before the first update"""
    pace_slack: int = 1000
    """the pace: env steps either side may run ahead of it before it waits"""


NAMES = [f.name for f in dataclasses.fields(Settings)]
Resolved = dataclasses.make_dataclass(  # what the loops run with: read-only
    "Resolved", [(f.name, f.type, f.default) for f in dataclasses.fields(Settings)], frozen=True
)
Resolved.__module__ = __name__  # where the docs find it
Resolved.__doc__ = "The settings of a run as the core resolved them (read-only)."


def resolve(exp, args) -> Resolved:
    """Each setting from ``args`` (the options) if it has the field, else from the experiment's
    attribute of that name (an older file's), else its default; one line if the two disagree."""
    found = {}
    for name in NAMES:
        if hasattr(args, name):
            found[name] = getattr(args, name)
        if not hasattr(exp, name):  # an older file's attribute, else the default
            continue
        mine = getattr(exp, name)
        if name in found and as_stored(mine) != as_stored(found[name]):
            said = f"the experiment's {name} is {mine!r}, its options' {found[name]!r}"
            raise ExperimentError(f"{said}: set it in the options alone (tinyverse.Settings)")
        found[name] = mine
    return Resolved(**found)


def as_stored(value):
    """A value as the options store it: a tuple as the list JSON makes of it."""
    return list(value) if isinstance(value, tuple) else value


def plain(args) -> dict:
    """The options as JSON stores them (``dataclasses.asdict``, tuples as lists)."""
    return {k: as_stored(v) for k, v in dataclasses.asdict(args).items()}


class Run:
    """What the core knows of a run, read-only to the experiment (``self.run``): the settings
    the loops run with, the options as stored, the run's update count. The core's loops and
    loader keep it up to date."""

    __slots__ = ("_exp", "_args", "_options", "_defaults", "_updates")

    def __init__(self, exp, args=None):
        self._exp = exp
        self._args = args  # the options dataclass: the loader's, tuned in place by the workers
        self._options = None  # set by the loader
        self._defaults = None  # set by the loader
        self._updates = 0  # set by the trainer before each update, by a player at each new params

    @property
    def settings(self) -> Resolved:
        """The core's settings as the loops read them: from the options (a
        :class:`Settings` subclass), else the experiment's attributes, else the defaults."""
        return resolve(self._exp, self._args)

    @property
    def args(self):
        """The options dataclass (``make_experiment``'s), or None."""
        return self._args

    @property
    def options(self) -> dict | None:
        """The run's resolved options as stored (tuples as lists), set by the loader; else None."""
        return self._options

    @property
    def option_defaults(self) -> dict | None:
        """The defaults of the experiment file's options dataclass, set by the loader."""
        return self._defaults

    @property
    def updates(self) -> int:
        """The run's updates so far, all trainers' across restarts, counted in minibatches of
        ``train_batch_size`` sessions: set before each ``train_step`` and whenever a player
        loads new params."""
        return self._updates
