"""The train loop, in-process with the fake experiment on every backend: resuming, publishing, waiting, batches;
and a stop that never waits for a sample (via the CLI)."""

import signal
import textwrap
import threading
import time

import numpy as np
import pytest
from conftest import ROOT, in_thread, joined, run_cli, spawn, trainer_waiting, wait_for
from fake_experiment import FakeExperiment

from tinyverse.database import connect
from tinyverse.errors import ExperimentError
from tinyverse.player import play
from tinyverse.trainer import train
from tinyverse.workers import Worker


@pytest.mark.parametrize("prefetch", [2, 0])  # a background thread, or fetching in the training thread
def test_trainer_resumes_from_stored_params_and_publishes_every_s_steps(db, prefetch):
    play(FakeExperiment(db), db, batch_size=2, rounds=3)
    trained = {"w": np.full((4, 2), 0.25, np.float32), "updates": np.array([7])}
    start = db.save_params(trained, min_version=5)

    seen = []
    exp = FakeExperiment(db, on_train=lambda update: seen.append(db.params_version()))
    exp.prefetch = prefetch
    final = train(exp, db, batch_size=3, updates=5, save_every=2, report_every=0.0)
    assert exp.prepared
    # published after updates 2 and 4, and the rest at the end: versions grow by one each time
    assert seen == [start, start, start + 1, start + 1, start + 2]
    assert final == db.params_version() == start + 3
    version, params = db.load_params()
    np.testing.assert_array_equal(params["w"], trained["w"])
    assert params["updates"][0] == 7 + 5, "the trainer must resume from the stored params"
    train_metrics = db.metrics("train")
    assert train_metrics and train_metrics[-1]["updates"] == 5 and "loss" in train_metrics[-1]
    assert not [w for w in db.workers() if w["role"] == "trainer"], "a finished trainer leaves the worker list"

    # a second trainer continues from there: the version never goes back
    again = train(FakeExperiment(db), db, batch_size=3, updates=2, save_every=100)
    assert again == start + 4
    assert db.load_params()[1]["updates"][0] == 14


def test_trainer_waits_for_sessions_then_starts(db):
    thread, outcome = in_thread(lambda: train(FakeExperiment(db), db, batch_size=2, updates=3, save_every=100))
    try:
        # registered, and saying in its heartbeat what it waits for
        waiting = wait_for(lambda: trainer_waiting(db, "for sessions"), 30, "the trainer to wait for sessions")
        wait_for(lambda: db.params_version() is not None, 30, "the trainer to store its initial params")
        # still waiting a heartbeat later: heartbeats go on while it waits
        wait_for(lambda: (trainer_waiting(db, "for sessions") or {}).get("time", 0) > waiting["time"], 30, "a beat")
        assert thread.is_alive() and "error" not in outcome, outcome
        assert db.count_sessions()[0] == 0
    finally:
        play(FakeExperiment(db), db, batch_size=2, rounds=1)
        thread.join(timeout=60)
    assert not thread.is_alive(), "the trainer did not start once sessions were there"
    if "error" in outcome:
        raise outcome["error"]
    assert outcome["result"] == db.params_version() == 2
    assert db.load_params()[1]["updates"][0] == 3


def test_train_step_error_is_raised_and_nothing_bad_is_published(db):
    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    start = db.params_version()
    exp = FakeExperiment(db, fail_at=4)
    with pytest.raises(ExperimentError, match="^train_step raised RuntimeError: train_step failed at update 4"):
        train(exp, db, batch_size=2, updates=10, save_every=2)
    version, params = db.load_params()
    assert version == start + 1, "only the publish after update 2 may happen"
    assert params["updates"][0] == 2
    assert np.isfinite(params["w"]).all(), "params broken by the failed step were published"
    assert not [w for w in db.workers() if w["role"] == "trainer"]


def test_a_batch_per_player_grows_and_shrinks_with_the_live_players(db):
    play(FakeExperiment(db), db, batch_size=4, rounds=5)  # 20 sessions
    players = [Worker(db, "player") for _ in range(3)]
    for w in players:
        w.beat(force=True)
    sizes = []
    exp = FakeExperiment(db, on_train=lambda n: [w.leave() for w in players[1:]] if n == 3 else None)
    exp.batch_per_player, exp.prefetch, exp.updates_per_step = True, 0, 100.0  # a pace: updates are counted
    step = exp.train_step
    exp.train_step = lambda batch: (sizes.append(len(batch["rewards"])), step(batch))[1]
    train(exp, db, batch_size=2, updates=6, report_every=0)  # looks at the players after every update
    assert sizes == [6, 6, 6, 2, 2, 2], "2 sessions a live player"
    assert db.counter("updates") == (3 * 6 + 3 * 2) // exp.train_batch_size, "counted by samples"


def test_a_batch_too_big_for_memory_is_refused_before_anything_is_stored(db):
    play(FakeExperiment(db), db, batch_size=2, rounds=1)
    version = db.params_version()
    exp = FakeExperiment(db)
    with pytest.raises(ExperimentError) as e:
        train(exp, db, batch_size=10**9, updates=1)
    message = str(e.value)
    each = sum(a.nbytes for k, a in db.get_batch([1]).items() if k != "id")  # a session's bytes
    assert message.startswith(f"a batch of 1,000,000,000 sessions of {each} bytes, {each / 2**30 * 1e9:,.1f} GiB, ")
    assert " GiB available: lower train -b to " in message and "\n" not in message
    assert db.params_version() == version and not db.workers() and not exp.prepared


def test_a_stop_never_waits_for_a_sample(db):
    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    before, release = set(threading.enumerate()), threading.Event()
    exp = FakeExperiment(db)
    exp.sample = lambda db, batch_size: release.wait(60) and {}  # a sample that takes a minute
    thread, outcome = in_thread(lambda: train(exp, db, batch_size=2, save_every=100))
    try:
        wait_for(lambda: trainer_waiting(db, "for a batch"), 30, "the trainer to wait on its sample")
        for w in db.workers():
            db.request_stop(w["id"])
        assert joined(thread, outcome, timeout=10) == db.params_version()  # long before the sample returns
    finally:
        release.set()
    left = lambda: [t for t in threading.enumerate() if t not in before and t.name == "prefetch"]  # noqa: E731
    wait_for(lambda: not left(), 10, "the prefetch thread to end once its sample returned")


SLOW = """
    import sys
    import time

    sys.path.insert(0, {tests!r})
    from fake_experiment import FakeExperiment


    class Slow(FakeExperiment):
        def sample(self, db, batch_size):
            time.sleep(60)  # a minute: a trainer told to stop must not wait for it
            return db.sample_batch(batch_size)


    def make_experiment(db):
        return Slow(db)
"""


def test_sigterm_stops_a_trainer_within_2_s_while_its_prefetch_thread_samples(tmp_path):
    exp = tmp_path / "slow.py"
    exp.write_text(textwrap.dedent(SLOW.format(tests=str(ROOT / "tests"))))
    url = f"sqlite:///{tmp_path / 'run.db'}"
    run_cli(exp, "play", "-n", "1", "-b", "2", "-q", "--db", url, cwd=tmp_path)
    db = connect(url, "slow")
    trainer = spawn(exp, "train", "-b", "2", "--db", url, cwd=tmp_path)
    wait_for(lambda: trainer_waiting(db, "for a batch") or not trainer.alive(), 60, "the trainer to sample")
    start = time.monotonic()
    assert trainer.stop(timeout=30, sig=signal.SIGTERM) == 0, trainer.stderr()
    assert time.monotonic() - start < 2.0, "the interpreter waited for the prefetch thread"
    assert "got SIGTERM" in trainer.stderr() and not db.workers()
    db.close()


def test_train_b_1000000_of_big_sessions_is_one_line_at_once(tmp_path):
    fake, url = ROOT / "tests" / "fake_experiment.py", f"sqlite:///{tmp_path / 'run.db'}"
    # sessions of 20,000 ticks, about 1 MB each: a million of them (train -b's cap) is a terabyte
    run_cli(fake, "play", "-n", "1", "-q", "--db", url, "--set", "session_length=20000", cwd=tmp_path)
    start = time.monotonic()
    proc = run_cli(fake, "train", "-b", "1000000", "-q", "--db", url, cwd=tmp_path, check=False, timeout=60)
    assert proc.returncode == 1 and time.monotonic() - start < 30, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("tinyverse: error: a batch of 1,000,000 sessions of ") and "lower train -b" in line


def test_a_batch_over_half_the_memory_is_refused_before_sampling(db):
    """The CLI caps -b; a caller of train() with a batch that cannot fit is refused by its size."""
    play(FakeExperiment(db), db, batch_size=2, rounds=1)
    with pytest.raises(ExperimentError, match=r"a batch of 1,000,000,000,000 sessions of .* lower train -b"):
        train(FakeExperiment(db), db, batch_size=10**12, updates=1)
