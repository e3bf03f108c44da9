"""The experiment contract: the hooks a user writes (:class:`Experiment`); the loader loads them."""

import abc
import dataclasses

import gymnasium as gym
import numpy as np

from .settings import Run

Arrays = dict[str, np.ndarray]


class Experiment(abc.ABC):
    """What a user writes: hooks on NumPy arrays, which the loops call like this::

        exp = make_experiment(args)                # player, trainer and eval alike

        # play (tinyverse.player.play): B environments of exp.make_env()
        memory = exp.initial_memory(B)
        until a stop:
            wait while ahead of the trainers       # the pace
            exp.set_params(params)                 # when newer params are stored
            for each of T ticks:                   # a round: a session of T ticks an environment
                actions, memory = exp.act(observations, memory)   # eval: greedy=True
            db.add_sessions(sessions)              # each with exp.session_info()

        # train (tinyverse.trainer.train)
        exp.prepare_training()
        until a stop:
            batch = exp.sample(db, B)              # once B sessions are stored
            wait while ahead of the players        # the pace
            metrics = exp.train_step(batch)
            db.save_params(exp.get_params())       # every save_every updates

    Hooks return promptly: the loops own the pace. The core's settings (T = ``session_length``,
    B, the pace, ...) are fields of the options, which inherit :class:`~tinyverse.Settings`;
    ``self.run`` is what the core knows of the run (read-only): its ``settings`` as resolved, its
    ``options`` and its ``updates`` so far. A batch stacks B sessions of T ticks:

    - ``observations`` (B, T+1, ...), ``actions`` (B, T, ...), ``rewards`` (B, T) float32,
      ``terminated`` and ``truncated`` (B, T) bool; after an episode ends at tick t,
      ``observations[:, t+1]`` begins the next one;
    - ``final_observations`` (B, T, ...): the last observation of the episode that ended at tick t
      (zeros elsewhere): bootstrap from it if ``truncated``, never if ``terminated``;
    - of a Dict or Tuple space (nested too), both are dicts by key, tuples by index, of such arrays
      (``batch["observations"]["board"]`` (B, T+1, ...); ``act`` gets them (B, ...)), stored flat
      (``observations.board``, nested keys joined with '.') as ``db.sample_batch`` returns them;
    - ``memory.<name>`` (B, ...): the memory before tick 0; ``outputs.<name>`` (B, T, ...):
      ``act``'s third item;
    - ``version`` (the params that acted), ``worker``, ``id`` (in the database) and
      ``info.<name>``, each (B,).
    """

    def __init__(self, args=None, db=None):
        """``args``: the options (``make_experiment``'s dataclass), where the core finds its
        settings (:class:`~tinyverse.Settings`); an older file's ``db`` is kept as ``self.db``."""
        if args is not None and not dataclasses.is_dataclass(args):  # super().__init__(db)
            db = args
            args = None
        if db is not None:
            self.db = db
        self._tinyverse_run = Run(self, args)

    @property
    def run(self) -> Run:
        """What the core knows of the run, read-only (:class:`~tinyverse.settings.Run`): its
        ``settings``, ``options`` and ``updates``."""
        if "_tinyverse_run" not in vars(self):  # a subclass that skips Experiment.__init__
            self._tinyverse_run = Run(self)
        return self._tinyverse_run

    @property
    def update_count(self) -> int:
        """The run's updates: ``self.run.updates``, under an older name."""
        return self.run.updates

    @abc.abstractmethod
    def make_env(self, render_mode: str | None = None) -> gym.Env:
        """A new Gymnasium environment (``render_mode`` is set by eval for video)."""

    def initial_memory(self, batch_size: int) -> Arrays:
        """The agent's memory at the start of an episode, batched along axis 0."""
        return {}

    @abc.abstractmethod
    def act(self, observations, memory: Arrays, greedy: bool = False) -> tuple:
        """Actions for a batch of observations (an array, or dicts and tuples of arrays nested as
        the observation space) and the new memory; optionally a third item, per-tick outputs."""

    def prepare_training(self) -> None:  # noqa: B027 (optional, not abstract)
        """Trainer-only setup (optimizers, compiled functions); players skip it."""

    def sample(self, db, batch_size: int) -> Arrays:
        """The next batch (uniform replay unless overridden); an empty one means "not yet": never
        wait here."""
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
        """Scalars stored with every session of this player (e.g. its epsilon)."""
        return {}
