"""The experiment: everything a user writes, behind a NumPy-only interface.

An experiment module defines ``make_experiment(db[, args: Args])`` returning an
:class:`Experiment`; players and trainers call it like this::

    exp = make_experiment(db, args)              # players and trainers alike
    memory = exp.initial_memory(B)
    actions, memory = exp.act(observations, memory)          # player, exploring
    exp.prepare_training()                       # trainer only: optimizers etc.
    metrics = exp.train_step(batch)              # batch[key][b] = session b
    db.save_params(exp.get_params())             # ... and on the other side
    exp.set_params(params)

Hooks return promptly: the loops own the pace (``updates_per_step``,
``learning_starts``, ``pace_slack``: :mod:`tinyverse.pace`). Options, the fields
of the dataclass ``Args``, come from ``--set name=value`` (:mod:`tinyverse.options`).
"""

import abc
import dataclasses
import importlib.util
import logging
import re
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

from .errors import ExperimentError
from .options import resolve

log = logging.getLogger(__name__)
EXTRAS = {"torch": "examples", "ale_py": "atari", "Box2D": "box2d", "vizdoom": "doom", "safetensors": "export"}
EXTRAS |= {"matplotlib": "plot", "imageio": "video"}
Arrays = dict[str, np.ndarray]


class Experiment(abc.ABC):
    """Base class of experiments: write the abstract hooks, override any other.

    A batch handed to ``train_step`` is a dict of arrays stacked over B sessions
    of T = ``session_length`` ticks:

    - ``observations`` (B, T+1, ...): what the agent saw at each tick, plus the
      observation after the last tick; after an episode ends at tick t,
      ``observations[:, t+1]`` is the first observation of the next episode;
    - ``final_observations`` (B, T, ...): the last observation of the episode
      that ended at tick t (zeros where none ended): bootstrap from it when the
      episode was ``truncated``, never when it was ``terminated``;
    - ``actions`` (B, T, ...), ``rewards`` (B, T) float32,
      ``terminated`` / ``truncated`` (B, T) bool;
    - ``memory.<name>`` (B, ...): the agent's memory before tick 0;
    - ``outputs.<name>`` (B, T, ...): what ``act`` returned besides actions;
    - ``version`` (B,): the params version that acted; ``worker`` (B,);
      ``id`` (B,): the session's id in the database; ``info.<name>`` (B,):
      what the player's ``session_info`` returned.
    """

    #: ticks per recorded session (sessions may cross episode boundaries)
    session_length: int = 25
    #: sessions the database keeps unless one is stored (None: as many as fit 1 GiB)
    buffer_size: int | None = None
    #: default of ``play -b``: environments each player runs at once
    play_batch_size: int = 1
    #: default of ``train -b``: sessions in a minibatch
    train_batch_size: int = 32
    #: ``train -b`` is per live player: more players bring fewer, larger updates
    batch_per_player: bool = False
    #: batches the trainer prepares in a background thread (0: fetch in the training thread)
    prefetch: int = 2
    #: default of ``train -s``: updates between the trainer's publications of params
    save_every: int = 100
    #: params arrays (globs) each trainer keeps its own, such as a target network: never merged
    local_params: tuple[str, ...] = ()
    #: the pace: updates of ``train_batch_size`` sessions per env step (None: each side runs free)
    updates_per_step: float | None = None
    #: env steps played before the first update (the replay buffer's minimum fill)
    learning_starts: int = 0
    #: env steps either side may run ahead of ``updates_per_step`` before it waits
    pace_slack: int = 1000
    #: the resolved options and the file's defaults (dicts of the dataclass's fields), set by :func:`load_experiment`
    options: dict | None = None
    option_defaults: dict | None = None
    #: the run's updates so far, all trainers', each of ``train_batch_size`` sessions (``-b`` does not skew it):
    #: set before each ``train_step`` and when a player loads new params, so schedules survive restarts
    update_count: int = 0

    def __init__(self, db=None):
        self.db = db

    @abc.abstractmethod
    def make_env(self, render_mode: str | None = None) -> gym.Env:
        """A new Gymnasium environment (``render_mode`` is set by eval for video)."""

    def initial_memory(self, batch_size: int) -> Arrays:
        """The agent's memory at the start of an episode, batched along axis 0."""
        return {}

    @abc.abstractmethod
    def act(self, observations: np.ndarray, memory: Arrays, greedy: bool = False) -> tuple[np.ndarray, Arrays]:
        """Actions for a batch of observations, and the new memory.

        Players explore (``greedy=False``); eval asks for the agent's best
        behaviour (``greedy=True``). ``act`` may return a third item, a dict of
        per-tick arrays (B, ...) such as the behaviour policy's log-probability
        of its action: players record each as ``outputs.<name>`` (B, T, ...).
        """

    def prepare_training(self) -> None:  # noqa: B027 (optional, not abstract)
        """Trainer-only setup (optimizers, compiled functions); players skip it."""

    def sample(self, db, batch_size: int) -> Arrays:
        """The next batch, stacked as ``db.sample_batch`` does (called in the prefetch thread).

        Uniform replay by default; override for prioritized replay, using
        ``db.session_range()`` and ``db.get_batch(ids)``. An empty batch means
        "not yet": the trainer asks again shortly. Return promptly: never wait here.
        """
        return db.sample_batch(batch_size)

    @abc.abstractmethod
    def train_step(self, batch: Arrays) -> dict[str, float]:
        """One update on a batch of sessions; return scalar metrics such as the loss."""

    @abc.abstractmethod
    def get_params(self) -> Arrays:
        """Everything players and trainers share (target networks too) as NumPy arrays."""

    @abc.abstractmethod
    def set_params(self, params: Arrays) -> None:
        """Load what ``get_params`` returned (shapes are checked before this is called)."""

    def session_info(self) -> dict[str, float]:
        """Scalars stored with every session of this player (e.g. its epsilon); return promptly."""
        return {}


def make_env(exp: Experiment, render_mode: str | None = None) -> gym.Env:
    """``exp.make_env``, its failure in one line (-vv shows where): a bad env id is a user's typo, not a crash."""
    try:
        return exp.make_env(render_mode=render_mode) if render_mode else exp.make_env()
    except Exception as e:
        log.debug("make_env failed", exc_info=True)
        raise ExperimentError(f"make_env failed: {type(e).__name__}: {e} (-vv shows where)") from None


def load_experiment(path: str, db=None, options: dict[str, str] | None = None) -> Experiment:
    """Import the experiment file at ``path`` and call its ``make_experiment(db[, args])``.

    ``options`` (``--set`` name=value strings) fill the dataclass that
    ``make_experiment`` takes, over the options stored in ``db``
    (:func:`tinyverse.options.resolve`); nothing is stored here.
    """
    module = import_file(path)
    factory = getattr(module, "make_experiment", None)
    if not callable(factory):
        raise ExperimentError(f"{path} defines no make_experiment(db); add one that returns a tinyverse.Experiment")
    args, exp_defaults = resolve(factory, path, db, options or {})
    try:
        exp = factory(db) if args is None else factory(db, args)
    except TypeError as e:
        if "abstract" not in str(e):
            raise ExperimentError(f"make_experiment in {path} failed: TypeError: {e} (-vv shows where)") from None
        found = re.search(r"abstract methods? (.+)$", str(e))  # "Can't instantiate ... abstract methods a, b"
        missing = found.group(1).replace("'", "") if found else str(e)
        raise ExperimentError(f"{path}: the experiment does not define {missing}: write them") from None
    except Exception as e:
        log.debug("make_experiment of %s failed", path, exc_info=True)
        raise ExperimentError(f"make_experiment in {path} failed: {type(e).__name__}: {e} (-vv shows where)") from None
    if not isinstance(exp, Experiment):
        raise ExperimentError(f"make_experiment in {path} returned {type(exp).__name__}, not a tinyverse.Experiment")
    exp.options, exp.option_defaults = None if args is None else dataclasses.asdict(args), exp_defaults
    return exp


def import_file(path: str):
    """The experiment module, imported from its file as ``python FILE.py`` would (its folder on sys.path)."""
    file = Path(path)
    if not file.is_file():
        raise ExperimentError(f"experiment file {path} not found; pass the path of a .py file")
    name = f"tinyverse_experiment_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ExperimentError(f"cannot import {path}: an experiment is a Python file ending in .py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up here
    if (folder := str(file.resolve().parent)) not in sys.path:
        sys.path.insert(0, folder)  # the experiment imports its neighbours
    try:
        spec.loader.exec_module(module)
        return module
    except SyntaxError as e:
        problem = f"{path}:{e.lineno}: syntax error: {e.msg}"
    except ImportError as e:
        extra = EXTRAS.get((e.name or "").split(".")[0])
        hint = f"'tinyverse[{extra}]'" if extra else (e.name or "it").split(".")[0]
        problem = f"{path} needs {e.name or e}: install it (pip install {hint})"
    except Exception as e:
        log.debug("import of %s failed", path, exc_info=True)
        problem = f"{path} failed to import: {type(e).__name__}: {e}"
    del sys.modules[name]
    raise ExperimentError(problem)
