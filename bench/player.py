"""The play loop's own cost: env steps/s of ``tinyverse.player.play`` with random actions and no network.

    python bench/player.py                       # CartPole observations, 8 environments, 400 rounds
    python bench/player.py --pixels --rounds 60  # the same game behind 80x80 uint8 frames (Atari-sized records)
    PYTHONPATH=/path/to/other/tree python bench/player.py   # another checkout's tinyverse, for a before/after

The environments and the policy are as cheap as they get, so what is left is the loop: recording the
ticks, encoding the sessions, one SQLite transaction a round. Alternate two trees a few times and compare
within a run: this machine's speed moves more than the loop does. ``-m cProfile`` shows the share of the
round spent in the environments' own ``step``.
"""

import argparse
import tempfile
import time

import gymnasium as gym
import numpy as np

import tinyverse
from tinyverse.database import connect
from tinyverse.player import play


class RandomPlay(tinyverse.Experiment):
    session_length = 25

    def __init__(self, db=None, pixels: bool = False):
        super().__init__(db)
        self.pixels = pixels

    def make_env(self, render_mode=None):
        env = gym.make("CartPole-v1")
        if self.pixels:  # the same game, its observations replaced by constant frames
            space = gym.spaces.Box(0, 255, (80, 80), np.uint8)
            env = gym.wrappers.TransformObservation(env, lambda o: np.ones((80, 80), np.uint8), space)
        return env

    def act(self, observations, memory, greedy=False):
        return np.random.randint(0, 2, len(observations)), memory

    def train_step(self, batch):
        return {}

    def get_params(self):
        return {"w": np.zeros(3, np.float32)}

    def set_params(self, params):
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pixels", action="store_true", help="80x80 uint8 frames instead of CartPole's 4 floats")
    parser.add_argument("--rounds", type=int, default=400, help="rounds (one session per environment each)")
    parser.add_argument("--envs", type=int, default=8, help="environments of the player (play -b)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = connect(f"sqlite:///{folder}/bench.db", "bench-player")
        exp = RandomPlay(db, args.pixels)
        start = time.perf_counter()
        sessions = play(exp, db, batch_size=args.envs, rounds=args.rounds, report_every=1e9)
        seconds = time.perf_counter() - start
    kind = "80x80 frames" if args.pixels else "CartPole"
    print(f"{kind}: {sessions * exp.session_length / seconds:,.0f} env steps/s ({tinyverse.__file__})")


if __name__ == "__main__":
    main()
