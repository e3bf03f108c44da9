"""The experiment contract: the hooks a user writes (:class:`Experiment`); the loader loads them."""

import abc

import gymnasium as gym
import numpy as np

Arrays = dict[str, np.ndarray]


class Experiment(abc.ABC):
    """What a user writes: hooks on NumPy arrays, which the loops call like this::

        exp = make_experiment(db, args)            # player, trainer and eval alike

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

    Hooks return promptly: the loops own the pace. A batch stacks B sessions of T =
    ``session_length`` ticks:

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

    session_length: int = 25  #: ticks per recorded session (sessions may cross episode boundaries)
    buffer_size: int | None = None  #: sessions the database keeps unless one is (None: 1 GiB's)
    play_batch_size: int = 1  #: default of ``play -b``: environments each player runs at once
    train_batch_size: int = 32  #: default of ``train -b``: sessions in a minibatch
    batch_per_player: bool = False  #: ``train -b`` is per live player: more players, larger updates
    prefetch: int = 2  #: batches sampled ahead in a background thread (0: in the training thread)
    save_every: int = 100  #: default of ``train -s``: updates between publications of params
    keep_last: int = 0  #: snapshots ``vN`` trainers keep of the newest versions (a league: 3)
    keep_every: int = 100  #: and of every version that is a multiple of this (0: none)
    local_params: tuple[str, ...] = ()  #: params (globs) each trainer keeps, e.g. a target network
    updates_per_step: float | None = None  #: the pace: updates an env step (None: no pace)
    learning_starts: int = 0  #: env steps played before the first update (the buffer's least fill)
    pace_slack: int = 1000  #: env steps either side may run ahead of the pace before it waits
    options: dict | None = None  #: the resolved options (``dataclasses.asdict``), set by the loader
    option_defaults: dict | None = None  #: the defaults of the experiment file's options dataclass
    option_args: object = None  #: the options dataclass make_experiment got (tuned in place)
    update_count: int = 0  #: the run's updates (of ``train_batch_size`` sessions), all trainers'

    def __init__(self, db=None):
        self.db = db

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
