"""A tiny NumPy-only two-player "game" for the tests of game results and ratings: each episode is two moves, and
its outcome is fixed by the opponent the option ``opponent`` names (read by ``make_env`` when it is called, as
``eval --opponent`` wants): ``beaten`` always loses to the agent, ``unbeaten`` always wins, ``even`` draws, and
``random`` wins, draws or loses at random. Every step's info names the opponent; ``--set named=0`` names none."""

import dataclasses

import gymnasium as gym
import numpy as np

from tinyverse import Experiment

OUTCOMES = {"beaten": 1.0, "unbeaten": -1.0, "even": 0.0}


@dataclasses.dataclass
class Args:
    opponent: str = "random"
    """who plays the other seat: beaten, unbeaten, even or random"""
    named: bool = True
    """whether the env names its opponent in info"""


class CoinGame(gym.Env):
    observation_space = gym.spaces.Dict(board=gym.spaces.Box(0, 1, (2,), np.uint8), seat=gym.spaces.Discrete(2))
    action_space = gym.spaces.Discrete(2)

    def __init__(self, opponent: str, named: bool):
        self.opponent = opponent
        self.info = {"opponent": opponent} if named else {}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.moves = 0
        return self.observation_space.sample(), dict(self.info)

    def step(self, action):
        self.moves += 1
        over = self.moves == 2
        outcome = OUTCOMES.get(self.opponent, float(self.np_random.integers(-1, 2)))
        return self.observation_space.sample(), outcome if over else 0.0, over, False, dict(self.info)


class GameExperiment(Experiment):
    session_length = 4

    def __init__(self, db, args: Args):
        super().__init__(db)
        self.args = args
        self.w = np.zeros(2, np.float32)

    def make_env(self, render_mode=None):
        return CoinGame(self.args.opponent, self.args.named)

    def act(self, observations, memory, greedy=False):
        return np.zeros(len(observations["seat"]), np.int64), memory

    def train_step(self, batch):
        self.w += 1
        return {"loss": 0.0}

    def get_params(self):
        return {"w": self.w.copy()}

    def set_params(self, params):
        self.w = params["w"].copy()


def make_experiment(db, args: Args):
    return GameExperiment(db, args)
