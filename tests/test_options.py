"""Options a user can see, runs a mistake cannot poison, hints that name the real command: from the user's side."""

import dataclasses
import sqlite3
import textwrap
import time

import pytest
from conftest import ROOT, run_cli, spawn

from tinyverse.database import connect
from tinyverse.errors import ExperimentError
from tinyverse.loader import import_file
from tinyverse.ops.monitor import describe
from tinyverse.options import adopt, resolve, store

FAKE = ROOT / "tests" / "fake_experiment.py"


def error_line(proc) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


def test_help_lists_the_options_with_type_default_stored_value_and_docstring(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    before = run_cli(FAKE, "play", "--help", "--db", url).stdout
    assert "options of" in before and "w_rows=4 (int): rows of w: 5 makes params of another shape" in before
    assert "max_steps=None (int | None): episode step limit" in before
    assert "epsilon=0.1 (float, tunable): players' random-action probability" in before  # in TUNABLE: tune takes it
    run_cli(FAKE, "play", "-n", "1", "-q", "--db", url, "--set", "w_rows=5")
    after = run_cli(FAKE, "train", "--help", "--db", url).stdout
    assert "w_rows=4 (int, stored 5): rows of w" in after, after
    info = run_cli(FAKE, "info", "--db", url).stdout
    assert "option    w_rows=4 (int, stored 5)" in info, info


def test_a_failed_start_leaves_the_namespace_as_it_was(tmp_path):
    """A bad --set that fails in make_env stores nothing: the corrected command just works."""
    url = f"sqlite:///{tmp_path / 'run.db'}"
    bad = tmp_path / "bad.py"
    bad.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT / "tests")!r})
        import gymnasium as gym
        from fake_experiment import Args, FakeExperiment, make_experiment as make

        class Env(FakeExperiment):
            def make_env(self, render_mode=None):
                return gym.make("CartPole-v1" if self.epsilon < 0.5 else "CartPole-v9")

        def make_experiment(db, args: Args):
            import dataclasses
            return Env(db, **dataclasses.asdict(args))
        """)
    )
    proc = run_cli(bad, "play", "-n", "1", "--db", url, "--prefix", "badenv", "--set", "epsilon=0.9", check=False)
    assert proc.returncode == 1, proc.stderr
    line, *frames = proc.stderr.strip().splitlines()  # one line, then the user's own frames: bad.py's alone
    assert line.startswith("tinyverse: error: make_env raised VersionNotFound") and "v9" in line
    assert frames and all(f.startswith(" ") for f in frames) and f'"{bad}", line 9, in make_env' in frames[0]
    db = connect(url, "badenv", retry_for=5)
    assert db.setting("options") is None and db.params_version() is None, "nothing stored by a failed start"
    run_cli(bad, "play", "-n", "1", "-q", "--db", url, "--prefix", "badenv", "--set", "epsilon=0.1")
    assert db.setting("options")["epsilon"] == 0.1 and db.count_sessions().added == 2
    info = run_cli(bad, "info", "--db", url, "--prefix", "badenv").stdout
    assert "epsilon=0.1" in info


def test_a_conflict_names_the_real_command_with_its_prefix(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    run_cli(FAKE, "play", "-n", "1", "-q", "--db", url, "--prefix", "mine", "--set", "w_rows=5")
    line = error_line(run_cli(FAKE, "play", "-n", "1", "--db", url, "--prefix", "mine", "--set", "w_rows=4",
                              check=False))  # fmt: skip
    assert "option w_rows=4 conflicts with w_rows=5, stored in prefix mine" in line
    assert f"python -m tinyverse {FAKE} clear --all --prefix mine" in line and "EXP " not in line


def test_info_shows_the_options_without_data_and_the_command_to_start(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    run_cli(FAKE, "play", "-n", "1", "-q", "--db", url, "--set", "epsilon=0.3")
    db = connect(url, "fake_experiment", retry_for=5)
    db.clear(sessions=True, params=True, metrics=True)
    assert db.params_version() is None and db.count_sessions().stored == 0
    info = run_cli(FAKE, "info", "--db", url, "--prefix", "fake_experiment").stdout
    assert "options   " in info and "epsilon=0.3" in info, info
    empty = run_cli(FAKE, "info", "--db", url, "--prefix", "other").stdout
    assert f"empty: start a player with python -m tinyverse {FAKE} play --prefix other" in empty, empty


def test_edited_defaults_are_said_in_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    exp = tmp_path / "mine.py"
    source = (ROOT / "tests" / "fake_experiment.py").read_text()
    exp.write_text(source)
    run_cli(exp, "play", "-n", "1", "-q", "--db", url)
    exp.write_text(source.replace("epsilon: float = 0.1", "epsilon: float = 0.25"))
    proc = run_cli(exp, "play", "-n", "1", "--db", url)
    said = [line for line in proc.stderr.splitlines() if "defaults changed" in line]
    assert len(said) == 1 and "epsilon: default now 0.25, stored 0.1" in said[0], proc.stderr
    assert connect(url, "mine", retry_for=5).setting("options")["epsilon"] == 0.1, "the stored one is used"


def test_a_missing_hook_is_one_line(tmp_path):
    exp = tmp_path / "partial.py"
    exp.write_text(
        textwrap.dedent("""
        import tinyverse

        class Partial(tinyverse.Experiment):
            def act(self, observations, memory, greedy=False):
                return observations[:, 0] > 0, memory

        def make_experiment(db):
            return Partial(db)
        """)
    )
    line = error_line(run_cli(exp, "play", "-n", "1", "--db", f"sqlite:///{tmp_path / 'x.db'}", check=False))
    assert "does not define get_params, make_env, set_params, train_step" in line, line


# -- the options module itself: what describe lists, what store refuses -----------------------------------------

BASE_AND_SUB = """
    import dataclasses


    @dataclasses.dataclass
    class Base:
        hidden: int = 64
        '''units in each layer'''
        lr: float = 0.1
        '''the base's step size'''


    @dataclasses.dataclass
    class Args(Base):
        lr: float = 0.2
        '''the subclass's step size'''
        name: str = dataclasses.field(default_factory=lambda: "made")
        seed: int | None = None


    def make_experiment(db, args: Args):
        raise RuntimeError("not called here")
"""


def test_describe_reads_the_docstrings_of_the_options_bases_too(tmp_path):
    """An Args that extends another (as an experiment may extend another's) lists every field with its help."""
    path = tmp_path / "sub.py"
    path.write_text(textwrap.dedent(BASE_AND_SUB))
    lines = describe(import_file(str(path)).make_experiment, {"hidden": 32, "lr": 0.2})
    assert lines == [
        "hidden=64 (int, stored 32): units in each layer",
        "lr=0.2 (float): the subclass's step size",
        "name='made' (str)",
        "seed=None (int | None)",
    ]


def test_describe_of_a_dataclass_defined_in_a_function_lists_the_fields_without_help():
    @dataclasses.dataclass
    class Args:
        depth: int = 3
        """(not readable: the class's source is indented)"""
        label: str = dataclasses.field(default="x")

    def make_experiment(db, args: Args):
        return None

    assert describe(make_experiment, None) == ["depth=3 (int)", "label='x' (str)"]
    assert describe(lambda db: None) == []


def test_a_required_option_is_described_so_and_stored_values_shown():
    @dataclasses.dataclass
    class Args:
        env_id: str

    def make_experiment(db, args: Args):
        return None

    assert describe(make_experiment) == ["env_id=required (str)"]
    assert describe(make_experiment, {"env_id": "Taxi-v3"}) == ["env_id=required (str, stored 'Taxi-v3')"]


def test_store_refuses_in_one_line_when_another_worker_stored_other_options_meanwhile(db):
    class Exp:
        options, option_defaults = {"lr": 0.1, "hidden": 64}, {"lr": 0.1, "hidden": 64}

    db.claim("options", {"lr": 0.3, "hidden": 64})  # the other worker's first write, between load and store
    with pytest.raises(ExperimentError) as info:
        store(Exp(), db)
    message = str(info.value)
    assert "another worker stored option lr=0.3" in message and "this one has 0.1" in message
    assert db.prefix in message and "start this worker again" in message and "\n" not in message
    assert db.setting("options") == {"lr": 0.3, "hidden": 64}, "the first write stays"
    store(type("Same", (), {"options": {"lr": 0.3, "hidden": 64}, "option_defaults": {}})(), db)  # agreeing: fine
    store(type("NoOptions", (), {"options": None})(), None)  # an experiment without options stores nothing


MISTYPED = [  # stored by hand: not what --set makes of the option's type
    ("session_length", "abc", "int"),
    ("session_length", 1.5, "int"),
    ("session_length", True, "int"),
    ("session_length", None, "int"),
    ("max_steps", "none", "int | None"),
    ("epsilon", "0.1", "float"),
    ("epsilon", False, "float"),
    ("progress", 5, "str | None"),
    ("progress", ["/etc", "passwd"], "str | None"),
    ("outputs", 1, "bool"),
    ("updates_per_step", {"x": 1}, "float | None"),
]


@pytest.mark.parametrize(("key", "value", "kind"), MISTYPED, ids=[f"{k}={v!r}" for k, v, _ in MISTYPED])
def test_a_stored_option_of_another_type_is_refused_in_one_line(db, key, value, kind):
    args = import_file(str(FAKE)).Args
    db.claim("options", {**dataclasses.asdict(args()), key: value})
    with pytest.raises(ExperimentError) as info:
        resolve(args, str(FAKE), db, {})
    message = str(info.value)
    assert f"prefix {db.prefix} stores option {key}={value!r}, not {kind}: use another --prefix" in message
    assert "clear --all" in message and "\n" not in message


def test_stored_options_of_the_types_set_makes_are_adopted(db):
    args = import_file(str(FAKE)).Args
    stored = {"session_length": 12, "max_steps": None, "epsilon": 1, "progress": "p.txt", "outputs": True}
    db.claim("options", stored)
    resolved, _ = resolve(args, str(FAKE), db, {})
    assert {k: getattr(resolved, k) for k in stored} == stored  # an int for a float is fine


def test_a_player_refuses_mistyped_stored_options_in_one_line(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    db = connect(url, "typed", retry_for=5)
    db.claim("options", {"session_length": "abc"})
    line = error_line(run_cli(FAKE, "play", "-n", "1", "--db", url, "--prefix", "typed", check=False))
    assert "prefix typed stores option session_length='abc', not int" in line and "clear --all" in line
    raw = sqlite3.connect(tmp_path / "run.db")
    with raw:
        raw.execute('UPDATE "typed:meta" SET value = ? WHERE key = ?', ("[1, 2]", "options"))
    raw.close()
    line = error_line(run_cli(FAKE, "play", "-n", "1", "--db", url, "--prefix", "typed", check=False))
    assert "setting 'options' of prefix typed is [1, 2]" in line and "clear --all --prefix typed" in line
    run_cli(FAKE, "clear", "--all", "--db", url, "--prefix", "typed")
    run_cli(FAKE, "play", "-n", "1", "-q", "--db", url, "--prefix", "typed")
    assert db.setting("options")["session_length"] == 8


def test_a_tuned_option_reaches_a_running_player_and_a_structural_one_is_still_refused(db_url, prefix, tmp_path):
    where = ("--db", db_url, "--prefix", prefix)
    player = spawn(FAKE, "play", *where, "--set", "report_epsilon=true", cwd=tmp_path)
    db = connect(db_url, prefix, retry_for=5)
    deadline = time.monotonic() + 60
    while db.count_sessions().added == 0:
        assert player.running() and time.monotonic() < deadline
        time.sleep(0.1)
    assert db.sample_batch(4)["info.epsilon"].tolist() == [0.1] * 4
    run_cli(FAKE, "tune", *where, "--set", "epsilon=0.5")  # tunable: stored, nothing cleared, no session played
    added = db.count_sessions().added
    while 0.5 not in db.sample_batch(8)["info.epsilon"].tolist():  # the running player adopted it
        assert player.running() and time.monotonic() < deadline + 60
        time.sleep(0.1)
    assert db.setting("options")["epsilon"] == 0.5 and db.count_sessions().added >= added
    run_cli(FAKE, "eval", "-n", "1", "--no-record", *where, "--set", "epsilon=0.9", cwd=tmp_path)  # its own only
    assert db.setting("options")["epsilon"] == 0.5 and len(db.setting("tuned")) == 1
    line = error_line(run_cli(FAKE, "tune", *where, "--set", "w_rows=5", check=False))
    assert "option w_rows=5 conflicts with w_rows=4" in line
    info = run_cli(FAKE, "info", *where).stdout
    assert "tuned     'epsilon': 0.1 -> 0.5 at update 0, 20" in info
    assert player.stop() == 0
    line = error_line(run_cli(FAKE, "tune", "--db", db_url, "--prefix", "norun", "--set", "epsilon=1", check=False))
    assert "tune needs --set NAME=VALUE and a run in prefix norun" in line
    db.close()


def test_a_hostile_stored_change_is_ignored_with_a_warning(db, caplog):
    args = import_file(str(FAKE)).Args()
    db.claim("options", dataclasses.asdict(args))
    assert adopt(args, db, 0) == 0  # no change stored: one read
    db.put("options", {**dataclasses.asdict(args), "epsilon": "0.9; rm -rf /", "w_rows": 9})
    db.add_to_counter("tunes", 1)
    assert adopt(args, db, 0) == 1
    assert args.epsilon == 0.1 and args.w_rows == 4, "junk ignored; a structural option never changes"
    assert "ignored the stored option epsilon='0.9; rm -rf /', not float" in caplog.text
    db.put("options", {**dataclasses.asdict(args), "epsilon": 0.25})
    db.add_to_counter("tunes", 1)
    assert adopt(args, db, 1) == 2 and args.epsilon == 0.25
