"""The params exchange: checking shapes, following the stored version, resume, trainers pushing deltas."""

import random
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from fake_experiment import FakeExperiment

from tinyverse.errors import ExperimentError, ParamsMismatch
from tinyverse.evaluation import evaluate
from tinyverse.params import Publisher, check_params, resume, sync_params
from tinyverse.player import play
from tinyverse.trainer import train

# -- check_params ------------------------------------------------------------------

EXPECTED = {
    "q.weight": np.zeros((4, 2), np.float32),
    "q.bias": np.zeros(2, np.float32),
    "steps": np.array(0, np.int64),
}


def mismatch(got: dict) -> str:
    with pytest.raises(ParamsMismatch) as info:
        check_params(EXPECTED, got, "sqlite:///x.db prefix p")
    message = str(info.value)
    assert "sqlite:///x.db prefix p" in message
    assert "--prefix" in message and "clear --del-params" in message, "the message says what to do"
    assert "\n" not in message
    return message


def test_matching_params_pass():
    assert check_params(EXPECTED, {k: np.ones_like(v) for k, v in EXPECTED.items()}, "db") is None
    assert check_params({}, {}, "db") is None
    # the same names, shapes and dtypes in another order, as decoded from the database
    assert check_params(EXPECTED, dict(reversed(list(EXPECTED.items()))), "db") is None


def test_wrong_shape_names_the_key_and_both_shapes():
    got = {**EXPECTED, "q.weight": np.zeros((4, 3), np.float32)}
    message = mismatch(got)
    assert "q.weight: stored float32[4, 3], model wants float32[4, 2]" in message
    assert "q.bias" not in message


def test_wrong_dtype_names_the_key_and_both_dtypes():
    message = mismatch({**EXPECTED, "q.bias": np.zeros(2, np.float64)})
    assert "q.bias: stored float64[2], model wants float32[2]" in message


def test_a_scalar_is_not_a_one_element_vector():
    message = mismatch({**EXPECTED, "steps": np.zeros(1, np.int64)})
    assert "steps: stored int64[1], model wants int64[]" in message


def test_missing_and_extra_keys_are_named():
    got = {k: v for k, v in EXPECTED.items() if k != "q.bias"}
    got["old.layer"] = np.zeros(1, np.float32)
    message = mismatch(got)
    assert "missing q.bias" in message and "unexpected old.layer" in message


@pytest.mark.parametrize("loop", ["train", "play", "eval"])
def test_params_of_another_shape_raise_params_mismatch(db, loop):
    foreign = {"w": np.ones((5, 2), np.float32), "updates": np.array([3])}
    version = db.save_params(foreign)
    exp = FakeExperiment(db)
    with pytest.raises(ParamsMismatch) as e:
        if loop == "train":
            train(exp, db, batch_size=1, updates=1)
        elif loop == "play":
            play(exp, db, rounds=1)
        else:
            evaluate(exp, db, episodes=1)
    message = str(e.value)
    assert "w: stored float32[5, 2], model wants float32[4, 2]" in message
    assert "--prefix" in message and "--del-params" in message
    assert "\n" not in message
    # nothing stored is touched
    assert db.params_version() == version
    np.testing.assert_array_equal(db.load_params()[1]["w"], foreign["w"])


# -- sync_params -------------------------------------------------------------------


def test_sync_params_loads_only_a_new_version_and_seeds_only_with_reseed(db):
    exp = FakeExperiment(db)
    assert sync_params(exp, db, None) is None and db.params_version() is None, "no reseed: nothing stored"
    seeded = sync_params(exp, db, None, reseed=True)
    assert seeded == db.params_version() == 1 and exp.loads == 0
    np.testing.assert_array_equal(db.load_params()[1]["w"], exp.w)

    other = FakeExperiment(db)
    assert sync_params(other, db, None, reseed=True) == 1 and other.loads == 1, "stored params are loaded, not reseeded"
    np.testing.assert_array_equal(other.w, exp.w)
    assert sync_params(other, db, 1) == 1 and other.loads == 1, "the same version is not loaded again"

    trained = {"w": np.full((4, 2), 3.0, np.float32), "updates": np.array([9])}
    new = db.save_params(trained)
    assert sync_params(other, db, 1) == new and other.loads == 2
    np.testing.assert_array_equal(other.w, trained["w"])


# -- resume ------------------------------------------------------------------------


class LateParams:
    """The real database, where a player stores its init right after the trainer found none."""

    def __init__(self, db, params):
        self.db, self.params, self.stored = db, params, None
        self.loads = 0

    def __getattr__(self, name):
        return getattr(self.db, name)

    def load_params(self):
        self.loads += 1
        found = self.db.load_params()
        if found is None and self.stored is None:  # between this load and the trainer's save
            self.stored = self.db.save_params(self.params, if_absent=True)
        return found


def test_resume_stores_its_init_when_none_are_stored(db):
    exp = FakeExperiment(db)
    assert resume(exp, db) == 1
    np.testing.assert_array_equal(db.load_params()[1]["w"], exp.w)
    assert exp.loads == 0


def test_resume_loads_params_stored_between_its_load_and_its_save(db):
    theirs = {"w": np.full((4, 2), 7.0, np.float32), "updates": np.array([0])}
    late = LateParams(db, theirs)
    exp = FakeExperiment(db)
    mine = exp.w.copy()
    version = resume(exp, late)
    assert late.stored == version == db.params_version(), "the version it resumes from is the stored one"
    # it acts on the params of that version, never on its own init under another's version number
    np.testing.assert_array_equal(exp.w, theirs["w"])
    assert exp.loads == 1 and late.loads == 2
    np.testing.assert_array_equal(db.load_params()[1]["w"], theirs["w"], err_msg="its init replaced them")
    assert not np.array_equal(mine, theirs["w"])


def test_resume_of_params_of_another_shape_raises_and_keeps_them(db):
    foreign = {"w": np.ones((5, 2), np.float32), "updates": np.array([3])}
    late = LateParams(db, foreign)
    with pytest.raises(ParamsMismatch, match=r"w: stored float32\[5, 2\], model wants float32\[4, 2\]"):
        resume(FakeExperiment(db), late)
    np.testing.assert_array_equal(db.load_params()[1]["w"], foreign["w"])


# -- params that hold NaN or inf are never stored ---------------------------------------


def test_an_init_of_nan_is_never_stored(db):
    exp = FakeExperiment(db, w_scale=np.nan)  # a broken init: w all NaN
    for run in (lambda: play(exp, db, rounds=1), lambda: train(exp, db, batch_size=1, updates=1)):
        with pytest.raises(ExperimentError) as e:
            run()
        assert str(e.value) == "params w hold NaN or inf at the experiment's init: fix it"
        assert db.params_version() is None, "stored as version 1 without a word"
    assert db.count_sessions() == (0, 0)


def test_a_trainer_that_diverges_stops_and_the_last_good_params_stay_published(db):
    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    exp = FakeExperiment(db, on_train=lambda update: exp.w.fill(np.inf) if update == 3 else None)
    with pytest.raises(ExperimentError) as e:  # publishes after update 2, then finds inf at update 4's push
        train(exp, db, batch_size=exp.train_batch_size, updates=10, save_every=2)
    fix = f"not published (v{db.params_version()} stays); lower the learning rate"
    assert str(e.value) == f"params w hold NaN or inf after update 4 of the run: {fix}"
    version, params = db.load_params()
    assert np.isfinite(params["w"]).all() and params["updates"][0] == 2, "the last good params are the stored ones"
    assert not db.workers(), "the trainer did not stop"
    # a player keeps playing the good params
    assert play(FakeExperiment(db), db, rounds=1) == 1 and db.params_version() == version


# -- Publisher: trainers pushing deltas -----------------------------------------------


class Params:
    """An experiment that is only its params: what a trainer trained is what a test writes."""

    local_params = ("target",)
    run = types.SimpleNamespace(updates=0)  # the run's updates, as the trainer keeps them (a NaN names it)

    def __init__(self, **arrays):
        self.params, self.loads = arrays, 0

    def get_params(self):
        return {k: v.copy() for k, v in self.params.items()}

    def set_params(self, params):
        self.params, self.loads = {k: v.copy() for k, v in params.items()}, self.loads + 1


def initial():
    return {"w": np.arange(6.0).reshape(2, 3), "head": np.zeros(2, np.float32), "count": np.array(0, np.int64)}


def trainer(db, sync=None, local=()):
    exp = Params(**initial())
    return exp, Publisher(exp, db, sync, local)


def test_one_trainer_stores_exactly_what_it_trained(db):
    exp, pub = trainer(db)
    rng = np.random.default_rng(0)
    for _ in range(20):
        exp.params["w"] += rng.normal(size=(2, 3)) * 10.0 ** rng.integers(-8, 3)
        exp.params["head"] -= np.float32(0.1)
        exp.params["count"] += 1
        version = pub.push()
        stored_version, stored = db.load_params()
        assert version == stored_version
        for k, v in exp.params.items():
            np.testing.assert_array_equal(stored[k], v, err_msg=k)  # bit for bit, not to a tolerance
    assert exp.loads == 0 and pub.conflicts == 0


def test_two_trainers_add_up_and_sync_once_they_see_each_other(db):
    a, pa = trainer(db)
    b, pb = trainer(db)  # both resume from the same stored params (b loads them)
    a.loads = b.loads = 0
    a.params["w"] += 1.0
    a.params["count"] += 3
    pa.push()
    b.params["w"] += 10.0
    b.params["count"] += 4
    pb.push()  # b sees a's push: it merges and, sync being automatic, takes the sum as its own
    stored = db.load_params()[1]
    np.testing.assert_array_equal(stored["w"], initial()["w"] + 11.0)
    assert int(stored["count"]) == 7, "integer arrays add up exactly, like counters"
    assert b.loads == 1 and a.loads == 0
    np.testing.assert_array_equal(b.params["w"], stored["w"])
    a.params["w"] += 100.0
    pa.push()  # a's next push keeps b's update and a's
    np.testing.assert_array_equal(db.load_params()[1]["w"], initial()["w"] + 111.0)
    assert a.loads == 1


def test_without_sync_a_trainer_keeps_its_own_params_and_pushes_only_its_progress(db):
    a, pa = trainer(db, sync=False)
    b, pb = trainer(db, sync=False)
    b.loads = 0
    a.params["w"] += 1.0
    pa.push()
    b.params["w"] += 10.0
    pb.push()
    b.params["w"] += 10.0
    pb.push()
    np.testing.assert_array_equal(db.load_params()[1]["w"], initial()["w"] + 21.0)
    np.testing.assert_array_equal(b.params["w"], initial()["w"] + 20.0)
    assert b.loads == 0


def test_local_arrays_are_written_as_they_are_and_never_taken(db):
    a, pa = trainer(db, local=("target",))
    a.params["target"] = np.zeros(3)
    pa.push()  # a new array name: its first push would fail the shape check, so start both with it
    b = Params(**initial(), target=np.zeros(3))
    pb = Publisher(b, db, local=("target",))
    a.params["target"] = np.full(3, 5.0)
    a.params["w"] += 1.0
    pa.push()
    b.params["target"] = np.full(3, 7.0)
    b.params["w"] += 2.0
    pb.push()  # b syncs: it takes the merged w but keeps its own target
    stored = db.load_params()[1]
    np.testing.assert_array_equal(stored["target"], np.full(3, 7.0), err_msg="a copy, not a sum of deltas")
    np.testing.assert_array_equal(stored["w"], initial()["w"] + 3.0)
    np.testing.assert_array_equal(b.params["target"], np.full(3, 7.0))
    np.testing.assert_array_equal(b.params["w"], stored["w"])


def test_a_nan_in_a_local_array_is_refused_too(db):
    exp, pub = trainer(db, local=("head",))
    exp.params["head"][1] = np.nan  # a trainer's own array (a target network) is published too: checked alike
    with pytest.raises(ExperimentError, match="^params head hold NaN or inf after update 1 of the run"):
        pub.push()
    assert db.params_version() == 1 and np.isfinite(db.load_params()[1]["head"]).all()


def test_a_lost_race_reloads_and_retries(db):
    a, pa = trainer(db)
    b, pb = trainer(db)
    save = db.save_params

    def racing(params, *args, **kwargs):  # b publishes between a's read and a's write, once
        db.save_params = save
        b.params["w"] += 10.0
        pb.push()
        return save(params, *args, **kwargs)

    a.params["w"] += 1.0
    db.save_params = racing
    pa.push()
    assert pa.conflicts == 1 and pb.conflicts == 0
    np.testing.assert_array_equal(db.load_params()[1]["w"], initial()["w"] + 11.0)
    assert db.params_version() == 3


def test_params_deleted_under_a_trainer_come_back_with_a_newer_version(db):
    a, pa = trainer(db)
    a.params["w"] += 1.0
    before = pa.push()
    db.clear(params=True)
    a.params["w"] += 1.0
    assert pa.push() > before
    np.testing.assert_array_equal(db.load_params()[1]["w"], a.params["w"])


PUSHER = """
import sys, types, numpy as np
from tinyverse.database import connect
from tinyverse.params import Publisher

class Params:
    run = types.SimpleNamespace(updates=0)
    def __init__(self, params): self.params = params
    def get_params(self): return {k: v.copy() for k, v in self.params.items()}
    def set_params(self, params): self.params = {k: v.copy() for k, v in params.items()}

url, prefix, index, pushes, sync = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
db = connect(url, prefix, retry_for=60)
exp = Params({"w": np.zeros((8, 4096)), "count": np.array(0, np.int64), "mine": np.zeros(8)})
pub = Publisher(exp, db, sync={"on": True, "off": False, "auto": None}[sync])
for k in range(pushes):
    if pushes > 1000:  # one-hot: push k of trainer i sets w[i, k] (all we ask of a killed trainer)
        exp.params["w"][index, k] += 1.0
    else:  # known deltas
        exp.params["w"] += np.random.default_rng(1000 * index + k).normal(size=(8, 4096))
    exp.params["count"] += 1
    pub.push()
print(pub.conflicts)
"""


def pushers(db_url, prefix, n, pushes, sync="auto"):
    argv = [sys.executable, "-c", PUSHER, db_url, prefix]
    return [
        subprocess.Popen([*argv, str(i), str(pushes), sync], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for i in range(n)
    ]


@pytest.mark.parametrize("sync", ["auto", "off"])
def test_concurrent_trainers_lose_no_update(db, db_url, sync):
    n, pushes = 4, 15
    db.save_params({"w": np.ones((8, 4096)), "count": np.array(0, np.int64), "mine": np.zeros(8)})
    procs = pushers(db_url, db.prefix, n, pushes, sync)
    conflicts = 0
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        conflicts += int(out)
    version, stored = db.load_params()
    expected = np.ones((8, 4096))
    for i in range(n):
        for k in range(pushes):
            expected += np.random.default_rng(1000 * i + k).normal(size=(8, 4096))
    np.testing.assert_allclose(stored["w"], expected, rtol=0, atol=1e-9)
    assert int(stored["count"]) == n * pushes and version == 1 + n * pushes, f"{conflicts} races were lost"


def test_trainers_killed_mid_push_leave_consistent_params(db, db_url):
    n = 4
    db.save_params({"w": np.zeros((8, 4096)), "count": np.array(0, np.int64), "mine": np.zeros(8)})
    procs = pushers(db_url, db.prefix, n, 4096)
    deadline = time.monotonic() + 60
    while (db.params_version() or 0) < 60 and time.monotonic() < deadline:
        time.sleep(0.01)
    for p in procs:
        time.sleep(random.random() * 0.05)
        p.kill()  # SIGKILL, mid-push as likely as not
        p.communicate()
    version, stored = db.load_params()  # decodes: no torn record
    w = stored["w"]
    assert set(np.unique(w)) <= {0.0, 1.0}
    for i in range(n):
        done = int(w[i].sum())
        assert w[i, :done].all() and not w[i, done:].any(), f"trainer {i}'s pushes are not a prefix"
    assert int(w.sum()) == int(stored["count"]) == version - 1 >= 60
