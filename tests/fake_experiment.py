"""A tiny, fast, NumPy-only experiment for the tests: CartPole and a linear policy.

``train_step`` adds 1 to the ``updates`` counter and leaves ``w`` alone, so a
test can tell from the params alone how many updates they have seen and
whether a trainer resumed from them (``w`` stays the first random init).
The memory counts the steps of the current episode, so a test can check that
players reset it when an episode ends.

Its knobs are the fields of :class:`Args`: keyword arguments of ``FakeExperiment``
in-process, ``--set name=value`` on the command line (stored with the run by
its first worker, adopted by the rest).
"""

import dataclasses
import time

import gymnasium as gym
import numpy as np

from tinyverse import Experiment


@dataclasses.dataclass
class Args:
    TUNABLE = ("epsilon",)  # a --set on a running prefix changes it, running workers adopt it

    session_length: int = 8
    """ticks per session"""
    max_steps: int | None = None
    """episode step limit (None: CartPole's 500); short limits truncate"""
    w_rows: int = 4
    """rows of w: 5 makes params of another shape"""
    epsilon: float = 0.1
    """players' random-action probability"""
    train_sleep: float = 0.0
    """seconds each train_step sleeps, so a kill lands mid-run"""
    progress: str | None = None
    """a file train_step writes its update count to"""
    fail_at: int | None = None
    """train_step corrupts the params and raises at this update"""
    updates_per_step: float | None = None
    """the pace: trainer updates per env step (None: no limit)"""
    learning_starts: int = 0
    """env steps played before the first update"""
    pace_slack: int = 1000
    """env steps either side may run ahead of the pace"""
    keep_last: int = 0
    """newest params versions trainers keep by name (0: none, for the tests that count what is kept)"""
    keep_every: int = 0
    """and of every version that is a multiple of this (0: none)"""
    outputs: bool = False
    """act also returns per-tick outputs: the sum of each observation, and the action twice"""
    report_epsilon: bool = False
    """session_info reports the options' epsilon as it is now (tuned options reach players)"""


class LoggedEnv(gym.Wrapper):
    """Records every reset and step, to rebuild the sessions a player should store."""

    def __init__(self, env):
        super().__init__(env)
        self.events = []

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.events.append(("reset", obs.copy()))
        return obs, info

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.events.append(("step", obs.copy(), int(action), float(reward), bool(terminated), bool(truncated)))
        return obs, reward, terminated, truncated, info


class FakeExperiment(Experiment):
    play_batch_size = 2
    train_batch_size = 4

    def __init__(
        self,
        db=None,
        session_length=8,
        max_steps=None,
        w_rows=4,
        epsilon=0.1,
        w_scale=1.0,
        train_sleep=0.0,
        progress=None,
        fail_at=None,
        updates_per_step=None,
        learning_starts=0,
        pace_slack=1000,
        outputs=False,
        keep_last=0,
        keep_every=0,
        report_epsilon=False,  # session_info reads it from the options (run.args): tuned in place
        on_round=None,
        on_train=None,
    ):
        super().__init__(db)
        self.updates_per_step, self.learning_starts, self.pace_slack = updates_per_step, learning_starts, pace_slack
        self.session_length, self.max_steps, self.epsilon = session_length, max_steps, epsilon
        self.outputs = outputs
        self.keep_last = keep_last
        self.keep_every = keep_every
        self.train_sleep, self.progress, self.fail_at = train_sleep, progress, fail_at
        self.on_round, self.on_train = on_round, on_train  # in-process hooks for tests
        self.rng = np.random.default_rng()
        self.w = (w_scale * self.rng.normal(size=(w_rows, 2))).astype(np.float32)
        self.updates = np.zeros(1, np.int64)
        self.envs, self.loads, self.greedy_calls, self.rounds, self.prepared = [], 0, 0, 0, False

    def make_env(self, render_mode=None):
        kwargs = {} if self.max_steps is None else {"max_episode_steps": self.max_steps}
        env = LoggedEnv(gym.make("CartPole-v1", render_mode=render_mode, **kwargs))
        self.envs.append(env)
        return env

    def initial_memory(self, batch_size):
        return {"steps": np.zeros(batch_size, np.int64)}

    def act(self, observations, memory, greedy=False):
        x = np.asarray(observations, np.float32)
        if len(self.w) > 4:
            x = np.concatenate([x, np.ones((len(x), 1), np.float32)], axis=1)
        actions = np.argmax(x @ self.w, axis=1)
        if greedy:
            self.greedy_calls += 1
        else:
            explore = self.rng.random(len(x)) < self.epsilon
            actions = np.where(explore, self.rng.integers(0, 2, len(x)), actions)
        actions, memory = actions.astype(np.int64), {"steps": memory["steps"] + 1}
        if self.outputs:
            return actions, memory, {"obs_sum": x[:, :4].sum(1), "twice": np.stack([actions, actions], 1)}
        return actions, memory

    def prepare_training(self):
        self.prepared = True

    def train_step(self, batch):
        assert batch["observations"].shape[:2] == (len(batch["rewards"]), self.session_length + 1)
        if self.train_sleep:
            time.sleep(self.train_sleep)
        if self.on_train is not None:
            self.on_train(int(self.updates[0]) + 1)
        if self.fail_at is not None and self.updates[0] + 1 >= self.fail_at:
            self.w[:] = np.nan  # half-done work that must never be published
            raise RuntimeError(f"train_step failed at update {self.fail_at}")
        self.updates += 1
        if self.progress:
            with open(self.progress, "w") as f:
                f.write(str(int(self.updates[0])))
        return {"loss": float(np.mean(batch["rewards"])), "counter": float(self.updates[0])}

    def get_params(self):
        return {"w": self.w.copy(), "updates": self.updates.copy()}

    def set_params(self, params):
        self.w, self.updates = params["w"].copy(), params["updates"].copy()
        self.loads += 1

    def session_info(self):
        self.rounds += 1
        if self.on_round is not None:
            self.on_round(self.rounds)
        args = self.run.args  # the options, tuned in place
        return {"epsilon": args.epsilon} if args is not None and args.report_epsilon else {}


def make_experiment(db, args: Args):
    return FakeExperiment(db, **dataclasses.asdict(args))
