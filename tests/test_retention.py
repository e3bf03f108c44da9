"""Trainers keep params snapshots ``vN`` as they publish, bounded: the last ``keep_last`` versions and every
``keep_every``-th, on both backends; named snapshots (``passed``) are never deleted; several trainers at once keep
the same set; players draw an opponent from the kept versions."""

import random
import signal
import time

import numpy as np
import pytest
from conftest import ROOT, in_thread, joined, run_cli, spawn, wait_for
from fake_experiment import FakeExperiment

from tinyverse import declared
from tinyverse.database import connect
from tinyverse.errors import ExperimentError
from tinyverse.player import play
from tinyverse.trainer import train


def kept(db) -> list[int]:
    """The versions kept as ``vN`` snapshots."""
    return [s.version for s in db.snapshots() if s.name == f"v{s.version}"]


def wanted(latest: int, last: int, every: int, first: int = 2) -> list[int]:
    """What retention keeps once versions ``first`` to ``latest`` were published."""
    return [v for v in range(first, latest + 1) if v > latest - last or v % every == 0]


def retaining(db, last: int, every: int) -> FakeExperiment:
    return FakeExperiment(db, keep_last=last, keep_every=every)


def test_a_trainer_keeps_the_last_k_and_every_mth_version_and_no_named_snapshot_is_touched(db):
    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    assert db.params_version() == 1
    db.save_snapshot("passed", *db.load_params()[::-1])
    seen = []  # (the stored version, what is kept) before each update: after each publication
    exp = retaining(db, 2, 4)
    exp.on_train = lambda n: seen.append((db.params_version(), kept(db)))
    assert train(exp, db, batch_size=2, updates=10, save_every=1) == 11
    assert seen[0] == (1, []) and all(versions == wanted(v, 2, 4) for v, versions in seen[1:]), seen
    assert kept(db) == [4, 8, 10, 11] == wanted(11, 2, 4)
    for v in kept(db):  # each the params of that version: the fake counts its updates in them
        version, params = db.load_params(f"v{v}")
        assert version == v and params["updates"][0] == v - 1
    assert db.find_params("passed")[0] == 1, "a named snapshot: never retention's"

    # a trainer started again (after a kill, say) goes on from what is kept
    assert train(retaining(db, 2, 4), db, batch_size=2, updates=3, save_every=1) == 14
    assert kept(db) == [4, 8, 12, 13, 14] and db.find_params("passed")[0] == 1


def test_a_version_published_but_not_yet_kept_when_its_trainer_died_is_kept_by_the_next_trainer(db):
    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    train(retaining(db, 2, 4), db, batch_size=2, updates=2, save_every=1)
    params = db.load_params()[1]
    assert db.save_params(params, 4, expect=3) is not None  # v4 published; the kill came before retain
    assert kept(db) == [2, 3]
    train(retaining(db, 2, 4), db, batch_size=2, updates=2, save_every=1)
    assert kept(db) == [4, 5, 6] == wanted(6, 2, 4)


def test_retention_set_to_zero_keeps_nothing_and_keep_every_alone_keeps_only_multiples(db):
    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    train(retaining(db, 0, 0), db, batch_size=2, updates=4, save_every=1)
    assert db.snapshots() == []
    train(retaining(db, 0, 3), db, batch_size=2, updates=4, save_every=1)  # v6 to v9
    assert kept(db) == [6, 9]


def test_two_trainers_publishing_at_once_keep_the_same_bounded_set(db, db_url, prefix):
    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    other = connect(db_url, prefix, retry_for=5)
    try:
        peak = []
        first = retaining(db, 3, 5)
        first.on_train = lambda n: peak.append(len(kept(db)))
        thread, outcome = in_thread(lambda: train(first, db, batch_size=2, updates=15, save_every=1))
        train(retaining(other, 3, 5), other, batch_size=2, updates=15, save_every=1)
        joined(thread, outcome)
    finally:
        other.close()
    latest = db.params_version()
    assert latest == 31, "each of the 30 publications landed"
    assert kept(db) == wanted(latest, 3, 5), "the set retention keeps, whichever trainer pruned last"
    assert max(peak) <= len(wanted(latest, 3, 5)) + 2, "over the bound by at most one a trainer, briefly"


def test_a_trainer_killed_at_any_moment_loses_no_kept_snapshot_and_the_next_one_prunes_what_it_left(
    db, db_url, prefix, tmp_path
):
    fake = ROOT / "tests" / "fake_experiment.py"
    settings = ["--set", "keep_last=2", "--set", "keep_every=3", "--set", "train_sleep=0.002"]
    where = ["--db", db_url, "--prefix", prefix, *settings]
    run_cli(fake, "play", "-n", "2", "-q", *where)
    trainer = spawn(fake, "train", "-s", "1", *where, cwd=tmp_path)
    wait_for(lambda: trainer.running() and (db.params_version() or 0) >= 20, message="20 publications")
    time.sleep(random.random() * 0.05)
    trainer.stop(sig=signal.SIGKILL)  # mid-publication, or mid-retain, as likely as not
    latest = db.params_version()
    held = set(kept(db))
    assert set(wanted(latest, 2, 3)) - {latest} <= held <= set(wanted(latest - 1, 2, 3)) | {latest}, (latest, held)
    for v in held:  # each whole: no torn record
        assert db.load_params(f"v{v}")[1]["updates"][0] == v - 1
    run_cli(fake, "train", "-n", "2", "-s", "1", "-q", *where)
    assert kept(db) == wanted(latest + 2, 2, 3), "the next trainer's publications prune what the kill left"


def test_a_draw_is_the_latest_or_uniform_over_the_kept_versions(db):
    assert db.draw_params() is None and db.draw_params("latest") is None
    for v in range(1, 8):
        db.save_params({"w": np.full(2, v, np.float32)}, v)
        db.retain(db.load_params()[1], v, 2, 3)
    db.save_snapshot("passed", {"w": np.zeros(2, np.float32)}, 5)
    assert kept(db) == [3, 6, 7]
    assert db.draw_params("latest")[0] == 7
    rng = random.Random(0)
    drawn = [db.draw_params(rng=rng) for _ in range(60)]
    assert {v for v, _ in drawn} == {3, 6, 7}, "each kept version, and no named snapshot"
    assert all((params["w"] == v).all() for v, params in drawn)
    with pytest.raises(ValueError, match="not 'latest', 'uniform' or 'weighted'"):
        db.draw_params("best")


@pytest.mark.parametrize(("name", "value"), [("keep_last", -1), ("keep_last", 51), ("keep_every", 1.5)])
def test_a_bad_retention_setting_is_refused_in_one_line(name, value):
    exp = FakeExperiment()
    setattr(exp, name, value)
    with pytest.raises(ExperimentError) as refused:
        declared.check(exp)
    assert f"the experiment's {name} is {value!r}, not a whole number" in str(refused.value)
