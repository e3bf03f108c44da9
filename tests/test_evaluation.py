"""eval: greedy episodes, mp4 videos that appear whole or not at all, Ctrl-C that keeps the summary,
returns and lengths printed as they are."""

import gymnasium as gym
import numpy as np
import pytest
from conftest import optional
from fake_experiment import FakeExperiment

from tinyverse.evaluation import evaluate

imageio = optional("imageio")
optional("imageio.v2")


class StopsAtEpisode(FakeExperiment):
    """Raises KeyboardInterrupt (what Ctrl-C raises) on the first step of episode ``at``."""

    def __init__(self, db, at):
        super().__init__(db, max_steps=30)
        self.at, self.resets = at, 0

    def initial_memory(self, batch_size):
        self.resets += 1
        return super().initial_memory(batch_size)

    def act(self, observations, memory, greedy=False):
        if self.resets == self.at:
            raise KeyboardInterrupt
        return super().act(observations, memory, greedy)


def test_eval_prints_returns_and_writes_one_video_per_episode(db, tmp_path, capsys):
    returns = evaluate(FakeExperiment(db, max_steps=30), db, 2, str(tmp_path / "rec"), seed=1)
    out = capsys.readouterr().out
    assert len(returns) == 2 and out.count("episode ") == 2 and "over 2 episodes" in out
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == ["episode_000.mp4", "episode_001.mp4"]


def test_ctrl_c_keeps_the_summary_of_finished_episodes(db, tmp_path, capsys):
    with pytest.raises(KeyboardInterrupt):
        evaluate(StopsAtEpisode(db, at=3), db, 5, str(tmp_path / "rec"))
    out = capsys.readouterr().out
    assert "interrupted after 2 of 5 episodes" in out and "over 2 episodes" in out
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == ["episode_000.mp4", "episode_001.mp4"]


def test_ctrl_c_while_a_video_is_written_leaves_no_file(db, tmp_path, monkeypatch, capsys):
    def interrupted(path, frames, **kwargs):  # ffmpeg has written part of the file when Ctrl-C lands
        with open(path, "wb") as f:
            f.write(b"\x00\x00\x00\x20ftypisom" + bytes(36))
        raise KeyboardInterrupt

    monkeypatch.setattr(imageio.v2, "mimwrite", interrupted)
    with pytest.raises(KeyboardInterrupt):
        evaluate(FakeExperiment(db, max_steps=30), db, 3, str(tmp_path / "rec"))
    assert list((tmp_path / "rec").iterdir()) == []
    assert "interrupted after 1 of 3 episodes" in capsys.readouterr().out


class Scripted(gym.Env):
    """Episodes of the given lengths, each step paying ``reward``: their returns are known in advance."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, lengths: list[int], reward: float):
        self.lengths, self.reward, self.episode, self.t = lengths, reward, -1, 0

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return np.zeros(4, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(4, np.float32), self.reward, False, self.t >= self.lengths[self.episode], {}


class Lander(FakeExperiment):
    """A MiniGrid-like scale of returns: 20 steps pay 0.958, which one decimal showed as 1.0."""

    def make_env(self, render_mode=None):
        return Scripted([20, 4], reward=0.0479)


def test_eval_prints_returns_with_three_significant_digits_and_the_lengths(db, capsys):
    returns = evaluate(Lander(db), db, 2)
    lines = capsys.readouterr().out.splitlines()
    assert returns == pytest.approx([0.958, 0.1916])
    assert lines[0] == "episode 1/2: return 0.958, length 20"
    assert lines[1] == "episode 2/2: return 0.192, length 4"
    assert lines[2] == "mean return 0.575 ± 0.383 over 2 episodes (random init: no params)"
    assert lines[3] == "mean length 12.0 ± 8.00 steps, min 4, max 20"


class Solved(FakeExperiment):
    """Ten equal returns of 0.9578125 (MiniGrid's 1 - 0.9 x 12/256), whose std NumPy computes as 1.11e-16."""

    def make_env(self, render_mode=None):
        return Scripted([1] * 10, reward=1 - 0.9 * 12 / 256)


def test_equal_returns_have_no_spread(db, capsys):
    evaluate(Solved(db), db, 10)
    assert "mean return 0.958 ± 0 over 10 episodes (random init: no params)" in capsys.readouterr().out.splitlines()
