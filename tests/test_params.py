"""The params exchange: checking shapes, following the stored version, a trainer's resume under races."""

import numpy as np
import pytest
from fake_experiment import FakeExperiment

from tinyverse.errors import ParamsMismatch
from tinyverse.params import check_params, resume, sync_params

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
    assert "--prefix" in message and "clear --del-weights" in message, "the message says what to do"
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
