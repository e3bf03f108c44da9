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
"""

import importlib.util
import logging
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

from .errors import ExperimentError, ParamsMismatch

log = logging.getLogger(__name__)
EXTRAS = {"ale_py": "atari", "Box2D": "box2d", "matplotlib": "plot", "imageio": "video"}  # module -> extra
Arrays = dict[str, np.ndarray]


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
    #: batches the trainer prepares in a background thread (0: fetch in the training thread)
    prefetch: int = 2

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
        behaviour (``greedy=True``).
        """
        raise NotImplementedError("define act(self, observations, memory, greedy=False) -> (actions, memory)")

    def prepare_training(self) -> None:
        """Trainer-only setup (optimizers, compiled functions); players skip it."""

    def sample(self, db, batch_size: int) -> Arrays | list[Arrays]:
        """The next batch, stacked, or a list of sessions to stack (in the prefetch thread).

        Uniform replay by default; override for prioritized replay, using
        ``db.session_range()`` and ``db.get_batch(ids)``. Fewer than ``batch_size``
        sessions (or none) means "not yet": the trainer asks again shortly.
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
        """Scalars stored with every session of this player (e.g. its epsilon)."""
        return {}


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


def load_experiment(path: str, db=None) -> Experiment:
    """Import the experiment file at ``path`` and call its ``make_experiment(db)``."""
    file = Path(path)
    if not file.is_file():
        raise ExperimentError(f"experiment file {path} not found; pass the path of a .py file")
    name = f"tinyverse_experiment_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise ExperimentError(f"cannot import {path}: an experiment is a Python file ending in .py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses and pickling-free introspection look here
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:
        problem = f"{path}:{e.lineno}: syntax error: {e.msg}"
    except ImportError as e:
        extra = EXTRAS.get((e.name or "").split(".")[0], "examples")
        problem = f"{path} needs {e.name or e}: install it (pip install 'tinyverse[{extra}]')"
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
    try:
        exp = factory(db)
    except Exception as e:
        log.debug("make_experiment of %s failed", path, exc_info=True)
        raise ExperimentError(f"make_experiment in {path} failed: {type(e).__name__}: {e} (-vv shows where)") from None
    if not isinstance(exp, Experiment):
        raise ExperimentError(
            f"make_experiment in {path} returned {type(exp).__name__}, not a tinyverse.Experiment subclass"
        )
    return exp
