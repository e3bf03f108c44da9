"""eval: greedy episodes, mp4 videos that appear whole or not at all, Ctrl-C that keeps the summary."""

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
