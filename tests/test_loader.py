"""Loading a user's experiment file: one line for each way it can fail, missing hooks named, --set texts typed."""

import sys
import textwrap
from pathlib import Path

import pytest

from tinyverse.errors import ExperimentError
from tinyverse.experiment import Experiment
from tinyverse.loader import load_experiment
from tinyverse.options import store

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

        def make_env(self, render_mode=None):
            raise RuntimeError("not played here")

        def act(self, observations, memory, greedy=False):
            return np.zeros(len(observations), np.int64), memory

        def train_step(self, batch):
            return {}

        def get_params(self):
            return {"w": self.w}

        def set_params(self, params):
            self.w = params["w"]


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


def test_the_loader_puts_the_experiments_folder_on_sys_path_once(tmp_path):
    (tmp_path / "neighbour_tv.py").write_text("VALUE = 7\n")
    path = write(tmp_path, GOOD.replace("import tinyverse\n", "import tinyverse\n    from neighbour_tv import VALUE\n"))
    before = list(sys.path)
    try:
        load_experiment(str(path))
        load_experiment(str(path))  # twice: still one entry
        assert sys.modules["neighbour_tv"].VALUE == 7
        assert [p for p in sys.path if p not in before] == [str(tmp_path.resolve())]
    finally:
        sys.path[:] = before
        sys.modules.pop("neighbour_tv", None)


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
    assert "needs no_such_module_tv" in message and "(pip install no_such_module_tv)" in message
    assert "tinyverse[" not in message, "an arbitrary module is not in one of tinyverse's extras"


def test_a_missing_submodule_suggests_its_top_level_package(tmp_path):
    message = load_error(write(tmp_path, "import no_such_pkg_tv.sub\n", "sub.py"))
    assert "needs no_such_pkg_tv" in message and "(pip install no_such_pkg_tv)" in message
    assert "tinyverse[" not in message


@pytest.mark.parametrize("module, extra", [("torch", "examples"), ("ale_py", "atari"), ("Box2D", "box2d")])
def test_a_module_of_an_extra_suggests_the_extra(tmp_path, module, extra):
    source = f'raise ModuleNotFoundError("No module named {module!r}", name={module!r})\n'
    message = load_error(write(tmp_path, source, f"needs_{extra}.py"))
    assert f"(pip install 'tinyverse[{extra}]')" in message


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
    assert "make_experiment(args)" in message and "tinyverse.Experiment" in message


@pytest.mark.parametrize(
    "returned, kind",
    [("{}", "dict"), ("None", "NoneType"), ("tinyverse.Experiment", "ABCMeta"), ("object()", "object")],
)
def test_make_experiment_returning_a_non_experiment(tmp_path, returned, kind):
    path = write(tmp_path, f"import tinyverse\n\ndef make_experiment(db):\n    return {returned}\n")
    message = load_error(path)
    assert f"returned {kind}" in message and "tinyverse.Experiment" in message


# -- the loader names the hooks the experiment lacks -----------------------------------------


MINIMAL = """
    import tinyverse


    class Exp(tinyverse.Experiment):
        {body}


    def make_experiment(db):
        return Exp(db)
"""
HOOKS = ["make_env", "act", "train_step", "get_params", "set_params"]


@pytest.mark.parametrize("missing", [HOOKS, ["make_env"], ["act", "set_params"]])
def test_missing_hooks_are_one_line_naming_them(tmp_path, missing):
    body = "\n        ".join(f"def {h}(self, *a, **k): pass" for h in HOOKS if h not in missing) or "pass"
    message = load_error(write(tmp_path, MINIMAL.format(body=body)))
    assert f"does not define {', '.join(sorted(missing))}: write them" in message


# -- options: a dataclass that make_experiment takes, filled by --set ------------------

OPTIONS = """
    import dataclasses
    import sys

    sys.path.insert(0, {tests!r})
    from fake_experiment import FakeExperiment


    @dataclasses.dataclass
    class Args:
        session_length: int = 8
        epsilon: float = 0.1
        name: str = "fake"
        greedy: bool = False
        max_steps: int | None = 50
        env_id: str | None = None
        lr: float | None = None  # None: the preset's

        def __post_init__(self):  # a preset, applied where the option was left at None
            if self.env_id == "short" and self.max_steps == 50:
                self.max_steps = 5
            if self.lr is None:
                self.lr = 0.5
            if self.epsilon > 1:  # an example's own check of its options
                raise ValueError(f"epsilon {{self.epsilon}} is not a probability")


    def make_experiment(db, args: Args):
        exp = FakeExperiment(db, session_length=args.session_length, epsilon=args.epsilon, max_steps=args.max_steps)
        exp.args = args
        return exp
"""


@pytest.fixture
def options_file(tmp_path):
    return write(tmp_path, OPTIONS.format(tests=str(Path(__file__).resolve().parent)), "with_options.py")


def test_options_fill_the_dataclass_and_default_without_a_db(options_file):
    exp = load_experiment(str(options_file), None, {"session_length": "5", "greedy": "yes", "max_steps": "none"})
    assert exp.session_length == 5 and exp.args.greedy is True and exp.args.max_steps is None
    assert exp.args.epsilon == 0.1 and exp.args.name == "fake"
    assert load_experiment(str(options_file)).args.session_length == 8
    assert load_experiment(str(options_file), None, {"env_id": "short"}).args.max_steps == 5


@pytest.mark.parametrize("greedy", ["1", "true", "Yes", "on", "0", "false", "NO", "off"])
def test_bool_options_take_the_usual_words(options_file, greedy):
    exp = load_experiment(str(options_file), None, {"greedy": greedy})
    assert exp.args.greedy is (greedy.lower() in ("1", "true", "yes", "on"))


def test_the_first_worker_stores_its_options_and_later_ones_adopt_them(options_file, db):
    first = load_experiment(str(options_file), db, {"session_length": "5", "name": "a=b"})
    assert first.session_length == 5 and first.args.name == "a=b"
    assert db.setting("options") is None, "stored at the first write, not at load"
    store(first.run, db)  # what a player does before its first session
    assert db.setting("options") == {
        "session_length": 5,
        "epsilon": 0.1,
        "name": "a=b",
        "greedy": False,
        "max_steps": 50,
        "env_id": None,
        "lr": 0.5,
    }
    later = load_experiment(str(options_file), db)  # no --set: the run's options
    assert later.session_length == 5 and later.args.name == "a=b"
    same = load_experiment(str(options_file), db, {"session_length": "5", "epsilon": "0.1"})  # agreeing is fine
    assert same.session_length == 5
    with pytest.raises(ExperimentError) as info:
        load_experiment(str(options_file), db, {"session_length": "6"})
    message = str(info.value)
    assert "session_length=6 conflicts with session_length=5" in message and db.prefix in message
    assert "clear --all" in message and "\n" not in message
    assert db.setting("options")["session_length"] == 5, "a refused worker changes nothing"


def test_a_given_none_that_resolves_to_the_stored_preset_agrees(options_file, db):
    store(load_experiment(str(options_file), db, {"lr": "none"}).run, db)  # stored as resolved: the preset's 0.5
    assert db.setting("options")["lr"] == 0.5
    assert load_experiment(str(options_file), db, {"lr": "none"}).args.lr == 0.5  # the same --set on a later worker
    with pytest.raises(ExperimentError, match="lr=0.3 conflicts with lr=0.5"):
        load_experiment(str(options_file), db, {"lr": "0.3"})


def test_options_stored_by_another_experiment_are_refused(options_file, db):
    db.claim("options", {"session_length": 8, "learning_rate": 0.1})
    message = load_error_with(options_file, db, {})
    assert "learning_rate" in message and "--prefix" in message


def load_error_with(path, db, options) -> str:
    with pytest.raises(ExperimentError) as info:
        load_experiment(str(path), db, options)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return message


@pytest.mark.parametrize(
    "options, words",
    [
        ({"sesion_length": "5"}, ["no option 'sesion_length'", "session_length, epsilon, name"]),
        ({"session_length": "five"}, ["session_length='five'", "not a int"]),
        ({"epsilon": "0.1.2"}, ["epsilon='0.1.2'", "not a float"]),
        ({"greedy": "maybe"}, ["greedy='maybe'", "not a bool"]),
        ({"max_steps": "lots"}, ["max_steps", "lots"]),
        ({"epsilon": "2"}, ["ValueError: epsilon 2.0 is not a probability"]),
    ],
)
def test_bad_options_are_one_line_errors(options_file, options, words):
    with pytest.raises(ExperimentError) as info:
        load_experiment(str(options_file), None, options)
    message = str(info.value)
    assert "\n" not in message
    for w in words:
        assert w in message, f"{w!r} not in {message!r}"


def test_an_experiment_without_options_refuses_them(tmp_path):
    path = write(tmp_path, GOOD)
    message = load_error_with(path, None, {"lr": "0.5"})
    assert "takes no options" in message and "dataclass" in message
    assert load_experiment(str(path), None, {}).config.lr == 0.1
