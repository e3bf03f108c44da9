"""The pace: what players and trainers wait for, and how updates are counted, in-process on every backend."""

import pytest
from conftest import train_until_waiting
from fake_experiment import FakeExperiment

from tinyverse.errors import ExperimentError
from tinyverse.pace import Pace
from tinyverse.player import play


class RunsDry(FakeExperiment):
    """Hands out batches for ``batches`` updates, then none: the trainer waits for a batch."""

    prefetch = 0

    def __init__(self, db, batches):
        super().__init__(db)
        self.batches = batches

    def sample(self, db, batch_size):
        self.batches -= 1
        return db.sample_batch(batch_size) if self.batches >= 0 else {}


def test_a_stopped_trainer_counts_only_its_updates(db):
    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    exp = RunsDry(db, batches=5)
    exp.updates_per_step = 1.0  # a pace, so that updates are counted
    train_until_waiting(exp, db, "for a batch", batch_size=exp.train_batch_size, save_every=100)
    assert db.load_params()[1]["updates"][0] == exp.updates[0] == 5
    assert db.counter("updates") == 5, "the pace counts an update that was never made"


@pytest.mark.parametrize("batch_size, counted", [(8, 2.0), (2, 0.5)])
def test_the_pace_counts_an_update_by_its_batch(db, batch_size, counted):
    # train -b B makes B / train_batch_size updates' worth of samples: a bigger batch, fewer updates
    T = 5
    exp = FakeExperiment(db, session_length=T)
    play(exp, db, batch_size=4, rounds=5)  # 20 sessions, 100 env steps
    exp.updates_per_step, exp.learning_starts, exp.pace_slack = 0.4, 0, 0  # 40 updates of 4 sessions
    train_until_waiting(exp, db, "for players", batch_size=batch_size, save_every=1000)
    made = int(exp.updates[0])
    assert made == pytest.approx(40 / counted, abs=1), f"{made} updates of {batch_size} sessions"
    assert db.counter("updates") == pytest.approx(40, abs=1)


@pytest.mark.parametrize("bad", [{"updates_per_step": 0}, {"learning_starts": -1}, {"pace_slack": -5}])
def test_a_bad_pace_is_one_clear_error_before_anything_is_stored(db, bad):
    exp = FakeExperiment(db, **{"updates_per_step": 1.0, **bad})
    with pytest.raises(ExperimentError, match="bad pace") as e:
        play(exp, db, rounds=1)
    assert next(iter(bad)) in str(e.value) and "\n" not in str(e.value)
    assert db.count_sessions() == (0, 0) and db.params_version() is None


def test_players_wait_while_ahead_by_more_than_the_slack_and_trainers_until_learning_starts(db):
    exp = FakeExperiment(db, session_length=5, updates_per_step=0.5, learning_starts=10, pace_slack=5)
    play(exp, db, batch_size=2, rounds=2)  # 20 env steps: a lead of 20 - 10 = 10 after the second round
    pace = Pace(exp, db)
    assert pace.player_waits() == "for the trainers: 0 updates for 20 env steps, target 0.5 an env step"
    db.add_to_counter("updates", 3)  # a lead of 10 - 3 / 0.5 = 4
    assert pace.player_waits() is None
    exp.updates_per_step = None
    assert Pace(exp, db).player_waits() is None, "without a ratio players run free"
    exp.learning_starts = 30
    assert Pace(exp, db).trainer_waits() == "for players: 20 of 30 env steps played before learning starts"
