"""The experiment: everything a user writes, behind a NumPy-only interface.

Players call ``act`` on batches of observations; trainers call ``train_step``
on batches of sessions; both meet through ``get_params``/``set_params``::

    exp = make_experiment(db)                    # players and trainers alike
    memory = exp.initial_memory(B)
    actions, memory = exp.act(observations, memory)          # player, exploring
    exp.prepare_training()                       # trainer only: optimizers etc.
    metrics = exp.train_step(batch)              # batch[key][b] = session b
    db.save_params(exp.get_params())             # ... and on the other side
    exp.set_params(params)

Hooks return promptly: the loops own the pace. An experiment that needs a
replay ratio declares ``updates_per_step`` (with ``learning_starts`` and
``pace_slack``) and the player and trainer loops wait for each other, while
they heartbeat and watch for a stop. Options come from a dataclass that
``make_experiment(db, args: Args)`` takes: ``--set name=value`` on the
command line, stored in the namespace by the first worker, adopted by the rest.
"""

import dataclasses
import importlib.util
import inspect
import logging
import sys
import types
import typing
from pathlib import Path

import gymnasium as gym
import numpy as np

from .errors import ExperimentError

log = logging.getLogger(__name__)
EXTRAS = {"torch": "examples", "ale_py": "atari", "Box2D": "box2d", "vizdoom": "doom"}
EXTRAS |= {"matplotlib": "plot", "imageio": "video"}
Arrays = dict[str, np.ndarray]
AFRESH = "use another --prefix, or start afresh with python -m tinyverse EXP clear --all"
BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


class Experiment:
    """Base class of experiments; override what your agent needs.

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
    #: sessions kept in the database by default (None: sized from one session)
    buffer_size: int | None = None
    #: default of ``play -b``: environments each player runs at once
    play_batch_size: int = 1
    #: default of ``train -b``: sessions in a minibatch
    train_batch_size: int = 32
    #: ``train -b`` is per live player: the batch grows with the players (checked every 2 s), and the pace
    #: counts it so, so more players bring fewer, larger updates instead of waiting for the trainer
    batch_per_player: bool = False
    #: batches the trainer prepares in a background thread (0: fetch in the training thread)
    prefetch: int = 2
    #: default of ``train -s``: updates between the trainer's publications of params
    save_every: int = 100
    #: params arrays (globs) each trainer keeps its own, such as a target network: never merged
    local_params: tuple[str, ...] = ()
    #: the pace the loops hold: trainer updates of ``train_batch_size`` sessions per env step played
    #: (None: each side runs free); an update of ``train -b B`` counts ``B / train_batch_size``
    updates_per_step: float | None = None
    #: env steps played before the first update (the replay buffer's minimum fill)
    learning_starts: int = 0
    #: env steps either side may run ahead of ``updates_per_step`` before it waits
    pace_slack: int = 1000

    def __init__(self, db=None):
        self.db = db

    def make_env(self, render_mode: str | None = None) -> gym.Env:
        """A new Gymnasium environment (``render_mode`` is set by eval for video)."""
        raise NotImplementedError("define make_env(self, render_mode=None) returning gymnasium.make(...)")

    def initial_memory(self, batch_size: int) -> Arrays:
        """The agent's memory at the start of an episode, batched along axis 0."""
        return {}

    def act(self, observations: np.ndarray, memory: Arrays, greedy: bool = False) -> tuple[np.ndarray, Arrays]:
        """Actions for a batch of observations, and the new memory.

        Players explore (``greedy=False``); eval asks for the agent's best
        behaviour (``greedy=True``). ``act`` may return a third item, a dict of
        per-tick arrays (B, ...) such as the behaviour policy's log-probability
        of its action (for an off-policy correction): players record each as
        ``outputs.<name>`` (B, T, ...) in the sessions; eval ignores them.
        """
        raise NotImplementedError("define act(self, observations, memory, greedy=False) -> (actions, memory)")

    def prepare_training(self) -> None:
        """Trainer-only setup (optimizers, compiled functions); players skip it."""

    def sample(self, db, batch_size: int) -> Arrays:
        """The next batch, stacked as ``db.sample_batch`` does (called in the prefetch thread).

        Uniform replay by default; override for prioritized replay, using
        ``db.session_range()`` and ``db.get_batch(ids)``. An empty batch means
        "not yet": the trainer asks again shortly. Return promptly: never wait here.
        """
        return db.sample_batch(batch_size)

    def train_step(self, batch: Arrays) -> dict[str, float]:
        """One update on a batch of sessions; return scalar metrics such as the loss."""
        raise NotImplementedError("define train_step(self, batch) -> {'loss': ...} to train")

    def get_params(self) -> Arrays:
        """Everything players and trainers share (target networks too) as NumPy arrays."""
        raise NotImplementedError("define get_params(self) -> dict[str, numpy.ndarray]")

    def set_params(self, params: Arrays) -> None:
        """Load what ``get_params`` returned (shapes are checked before this is called)."""
        raise NotImplementedError("define set_params(self, params: dict[str, numpy.ndarray])")

    def session_info(self) -> dict[str, float]:
        """Scalars stored with every session of this player (e.g. its epsilon); return promptly."""
        return {}


def load_experiment(path: str, db=None, options: dict[str, str] | None = None) -> Experiment:
    """Import the experiment file at ``path`` and call its ``make_experiment(db[, args])``.

    ``options`` (``--set`` name=value strings) fill the dataclass that
    ``make_experiment`` takes; see :func:`~tinyverse.experiment.resolve_options`.
    """
    file = Path(path)
    if not file.is_file():
        raise ExperimentError(f"experiment file {path} not found; pass the path of a .py file")
    name = f"tinyverse_experiment_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ExperimentError(f"cannot import {path}: an experiment is a Python file ending in .py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling-free introspection look here
    folder = str(file.resolve().parent)  # as `python file.py` does: the experiment imports its neighbours
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        problem = f"{path}:{e.lineno}: syntax error: {e.msg}"
    except ImportError as e:
        extra = EXTRAS.get((e.name or "").split(".")[0])
        hint = f"'tinyverse[{extra}]'" if extra else (e.name or "it").split(".")[0]
        problem = f"{path} needs {e.name or e}: install it (pip install {hint})"
    except Exception as e:
        log.debug("import of %s failed", path, exc_info=True)
        problem = f"{path} failed to import: {type(e).__name__}: {e}"
    else:
        problem = None
    if problem:
        del sys.modules[name]
        raise ExperimentError(problem)
    factory = getattr(module, "make_experiment", None)
    if not callable(factory):
        raise ExperimentError(f"{path} defines no make_experiment(db); add one that returns a tinyverse.Experiment")
    args = resolve_options(factory, path, db, options or {})
    try:
        exp = factory(db) if args is None else factory(db, args)
    except Exception as e:
        log.debug("make_experiment of %s failed", path, exc_info=True)
        raise ExperimentError(f"make_experiment in {path} failed: {type(e).__name__}: {e} (-vv shows where)") from None
    if not isinstance(exp, Experiment):
        raise ExperimentError(
            f"make_experiment in {path} returned {type(exp).__name__}, not a tinyverse.Experiment subclass"
        )
    exp.options = None if args is None else dataclasses.asdict(args)  # as resolved: what export writes
    return exp


def resolve_options(factory, path: str, db, given: dict[str, str]):
    """The options dataclass for ``factory``: ``given`` over those stored in ``db``, stored if none are.

    A given value that differs from the stored one is an error: a run never splits silently.
    """
    names = list(inspect.signature(factory).parameters)
    hint = typing.get_type_hints(factory).get(names[1]) if len(names) > 1 else None
    kind = next((k for k in typing.get_args(hint) or [hint] if dataclasses.is_dataclass(k)), None)  # Args | None
    if not (isinstance(kind, type) and dataclasses.is_dataclass(kind)):
        if given:
            raise ExperimentError(
                f"{path} takes no options: its make_experiment(db, args: Args) needs a dataclass Args"
            )
        return None
    hints = typing.get_type_hints(kind)
    fields = [f.name for f in dataclasses.fields(kind)]
    chosen = {}
    for key, text in given.items():
        if key not in fields:
            raise ExperimentError(f"{path} has no option {key!r}; its options: {', '.join(fields)}")
        chosen[key] = _parse(key, text, hints[key])
    stored = None if db is None else db.setting("options")
    for key in (stored or {}).keys() - set(fields):
        raise ExperimentError(f"{path} has no option {key!r}, stored in prefix {db.prefix}: {AFRESH}")
    try:
        args = kind(**{**(stored or {}), **chosen})
    except Exception as e:  # a check of the options' own (__post_init__)
        raise ExperimentError(f"options of {path}: {type(e).__name__}: {e}") from None
    resolved = dataclasses.asdict(args)
    for key, value in chosen.items():  # compared as resolved: "none" may stand for a preset's value
        if stored is not None and key in stored and stored[key] != resolved[key]:
            raise ExperimentError(
                f"option {key}={value!r} conflicts with {key}={stored[key]!r}, stored in prefix {db.prefix} by "
                f"the run's first worker: drop --set {key}, {AFRESH}"
            )
    if db is not None and stored is None and db.claim("options", resolved) != resolved:
        return resolve_options(factory, path, db, given)  # another worker stored first: adopt its options
    return args


def _parse(key: str, text: str, hint):
    """``text`` as the field's type: bool, int, float or str ("none" for an optional field)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] if union else [hint]
    if union and text.lower() == "none":
        return None
    if len(kinds) != 1 or kinds[0] not in (bool, int, float, str):
        raise ExperimentError(f"option {key} has type {hint}: only bool, int, float and str options can be set")
    try:
        return BOOLS[text.lower()] if kinds[0] is bool else kinds[0](text)
    except (KeyError, ValueError):
        raise ExperimentError(f"option {key}={text!r}: not a {kinds[0].__name__}") from None
