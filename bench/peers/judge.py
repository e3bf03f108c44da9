"""The judge's side inside every process that plays: each game's raw return, and CartPole's greedy eval.

This module runs in the tinyverse environment (``bench/cartpole.py``) and in each peer's own venv
(``bench/peers/*_run.py``), so it needs nothing but NumPy and Gymnasium (0.29 or 1.x).

``EpisodeLog`` is the outermost wrapper of every peer's training environment. The peers' own logs keep
only means over a window of games (Sample Factory's "Avg episode reward" over ``stats_avg`` games,
RLlib's ``episode_return_mean``), where the judge needs every game; so each environment appends a JSON
line per finished game to the file ``$PEERS_EPISODES`` names: ``{"t": time, "r": raw return, "n": this
environment's agent steps, "env": its id}``, and every ``TICK`` agent steps a line without ``r``, so
that ``bench/peers.py`` can add up the agent steps of all environments at any moment. The raw return
is ``info["episode"]["r"]`` of a ``RecordEpisodeStatistics`` wrapped right around the game (as SB3's
``Monitor`` in ``bench/atari_learn.py``): the whole game's score, before reward clipping.
"""

import json
import os
import time

import gymnasium as gym
import numpy as np

TICK = 250  # agent steps between an environment's step-count lines: a summed count is off by less than this
SOLVED = 475.0


class EpisodeLog(gym.Wrapper):
    """Appends a line to ``$PEERS_EPISODES`` at every finished game (and every TICK agent steps)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.path, self.steps = os.environ.get("PEERS_EPISODES"), 0
        self.name = f"{os.getpid()}-{id(self)}"  # one process may hold several environments

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        game = info.get("episode") if terminated or truncated else None
        if game is not None or self.steps % TICK == 0:
            row = {"t": time.time(), "n": self.steps, "env": self.name}
            row |= {"r": float(np.asarray(game["r"]).reshape(-1)[0])} if game is not None else {}
            self.write(row)
        return obs, reward, terminated, truncated, info

    def write(self, row: dict) -> None:
        if self.path:  # one write of one line with O_APPEND: lines of several processes never interleave
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (json.dumps(row) + "\n").encode())
            finally:
                os.close(fd)


def evaluate(act, seed: int, episodes: int, reset=None) -> float:
    """Mean return of ``episodes`` greedy CartPole-v1 episodes; ``act(obs) -> action``; ``reset()`` (a
    recurrent policy's) at each episode's start. The same episode seeds for every system:
    ``bench/cartpole.py`` (SB3, tinyverse) and the peers."""
    env, returns = gym.make("CartPole-v1"), []
    for ep in range(episodes):
        obs, _ = env.reset(seed=10_000 * (seed + 1) + ep)
        if reset:
            reset()
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs))
            total += reward
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))
