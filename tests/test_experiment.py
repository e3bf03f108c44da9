"""The experiment contract: loading a user's file, checking params, the base class's guidance."""

import sys
import textwrap

import numpy as np
import pytest

from tinyverse.errors import ExperimentError, ParamsMismatch, TinyverseError
from tinyverse.experiment import Experiment, check_params, load_experiment

GOOD = """
    from dataclasses import dataclass

    import numpy as np
    import tinyverse


    @dataclass
    class Config:
        '''dataclasses look the module up in sys.modules: the loader must register it'''
        lr: float = 0.1


    class Exp(tinyverse.Experiment):
        session_length = 7

        def __init__(self, db):
            super().__init__(db)
            self.config = Config()
            self.w = np.zeros(3, dtype=np.float32)


    def make_experiment(db):
        return Exp(db)


    if __name__ == "__main__":
        raise SystemExit("the loader must not run the file as a script")
"""


def write(tmp_path, source: str, name: str = "exp.py"):
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return path


def load_error(path) -> str:
    with pytest.raises(ExperimentError) as info:
        load_experiment(str(path))
    message = str(info.value)
    assert str(path) in message, "the error names the file"
    assert "\n" not in message, "one line"
    return message


def test_a_good_file_loads_and_gets_the_db(tmp_path):
    db = object()
    exp = load_experiment(str(write(tmp_path, GOOD)), db)
    assert isinstance(exp, Experiment)
    assert exp.db is db
    assert exp.session_length == 7 and exp.config.lr == 0.1


def test_files_with_the_same_name_in_two_folders_stay_apart(tmp_path):
    a = write(tmp_path / "a", GOOD)
    b = write(tmp_path / "b", GOOD.replace("session_length = 7", "session_length = 9"))
    assert load_experiment(str(a)).session_length == 7
    assert load_experiment(str(b)).session_length == 9
    assert load_experiment(str(a)).session_length == 7


def test_the_loader_does_not_touch_sys_path(tmp_path):
    before = list(sys.path)
    load_experiment(str(write(tmp_path, GOOD)))
    with pytest.raises(ExperimentError):
        load_experiment(str(write(tmp_path, "import no_such_module_tv", "bad.py")))
    assert sys.path == before


def test_missing_file(tmp_path):
    message = load_error(tmp_path / "nope.py")
    assert "not found" in message


def test_a_folder_is_not_an_experiment(tmp_path):
    (tmp_path / "folder.py").mkdir()
    assert "not found" in load_error(tmp_path / "folder.py")


def test_a_file_that_is_not_python(tmp_path):
    message = load_error(write(tmp_path, GOOD, "exp.txt"))
    assert ".py" in message


def test_syntax_error_names_the_line(tmp_path):
    path = write(tmp_path, "import numpy\n\ndef make_experiment(db)\n    return None\n")
    message = load_error(path)
    assert f"{path}:3:" in message and "syntax error" in message


def test_import_error_names_the_missing_module_and_the_fix(tmp_path):
    message = load_error(write(tmp_path, "import no_such_module_tv\n\ndef make_experiment(db): pass\n"))
    assert "no_such_module_tv" in message and "install" in message


def test_an_exception_at_import_time(tmp_path):
    message = load_error(write(tmp_path, "x = 1\nraise RuntimeError('broken on purpose')\n"))
    assert "RuntimeError" in message and "broken on purpose" in message


def test_an_exception_inside_make_experiment(tmp_path):
    source = "def make_experiment(db):\n    raise ValueError('no GPU named cuda:7')\n"
    message = load_error(write(tmp_path, source))
    assert "make_experiment" in message and "ValueError: no GPU named cuda:7" in message


def test_a_failed_import_leaves_no_module_behind(tmp_path):
    load_error(write(tmp_path, "raise RuntimeError('broken')\n", name="leftover.py"))
    assert "tinyverse_experiment_leftover" not in sys.modules


@pytest.mark.parametrize("source", ["x = 1\n", "make_experiment = 5\n", "def make_Experiment(db): pass\n"])
def test_missing_make_experiment(tmp_path, source):
    message = load_error(write(tmp_path, source))
    assert "make_experiment(db)" in message and "tinyverse.Experiment" in message


@pytest.mark.parametrize(
    "returned, kind",
    [("{}", "dict"), ("None", "NoneType"), ("tinyverse.Experiment", "type"), ("object()", "object")],
)
def test_make_experiment_returning_a_non_experiment(tmp_path, returned, kind):
    path = write(tmp_path, f"import tinyverse\n\ndef make_experiment(db):\n    return {returned}\n")
    message = load_error(path)
    assert f"returned {kind}" in message and "tinyverse.Experiment" in message


def test_experiment_errors_are_tinyverse_errors():
    assert issubclass(ExperimentError, TinyverseError) and issubclass(ParamsMismatch, TinyverseError)


# -- check_params -----------------------------------------------------------------

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
    check_params(EXPECTED, {k: np.ones_like(v) for k, v in EXPECTED.items()}, "db")
    check_params({}, {}, "db")


def test_wrong_shape_names_the_key_and_both_shapes():
    got = {**EXPECTED, "q.weight": np.zeros((4, 3), np.float32)}
    message = mismatch(got)
    assert "q.weight" in message and "[4, 3]" in message and "[4, 2]" in message
    assert "q.bias" not in message


def test_wrong_dtype_names_the_key_and_both_dtypes():
    message = mismatch({**EXPECTED, "q.bias": np.zeros(2, np.float64)})
    assert "q.bias" in message and "float64" in message and "float32" in message


def test_a_scalar_is_not_a_one_element_vector():
    message = mismatch({**EXPECTED, "steps": np.zeros(1, np.int64)})
    assert "steps" in message


def test_missing_and_extra_keys_are_named():
    got = {k: v for k, v in EXPECTED.items() if k != "q.bias"}
    got["old.layer"] = np.zeros(1, np.float32)
    message = mismatch(got)
    assert "missing q.bias" in message and "unexpected old.layer" in message


# -- the base class says what to implement -----------------------------------------


@pytest.mark.parametrize(
    "call, names",
    [
        (lambda e: e.make_env(), ["make_env", "gymnasium.make"]),
        (lambda e: e.act(np.zeros((1, 4)), {}), ["act", "memory"]),
        (lambda e: e.act(np.zeros((1, 4)), {}, greedy=True), ["act"]),
        (lambda e: e.train_step({}), ["train_step"]),
        (lambda e: e.get_params(), ["get_params", "numpy"]),
        (lambda e: e.set_params({}), ["set_params"]),
    ],
    ids=["make_env", "act", "act-greedy", "train_step", "get_params", "set_params"],
)
def test_unimplemented_methods_say_what_to_define(call, names):
    with pytest.raises(NotImplementedError) as info:
        call(Experiment())
    message = str(info.value)
    assert message.startswith("define ")
    for name in names:
        assert name in message


def test_the_rest_has_working_defaults():
    exp = Experiment(db="the db")
    assert exp.db == "the db"
    assert exp.initial_memory(3) == {}
    assert exp.session_info() == {}
    assert exp.prepare_training() is None
    assert isinstance(exp.session_length, int) and exp.session_length > 0
