"""One channel for settings: an experiment's options inherit ``tinyverse.Settings`` and ``--set`` sets the core's
settings like any option; what the core knows of a run is ``exp.run``, read-only; older files (settings as class
attributes, ``make_experiment(db)``) keep working."""

import dataclasses
import re

import numpy as np
import pytest
from conftest import run_cli

import tinyverse
from tinyverse.database import connect
from tinyverse.declared import SETTINGS
from tinyverse.errors import ExperimentError
from tinyverse.loader import import_file, load_experiment
from tinyverse.ops.monitor import describe
from tinyverse.options import store
from tinyverse.player import play
from tinyverse.settings import NAMES
from tinyverse.trainer import train

HOOKS = '''
class Still(tinyverse.Experiment):
    """Always action 0 on CartPole; train_step learns nothing."""

    def make_env(self, render_mode=None):
        return gym.make("CartPole-v1", render_mode=render_mode)

    def act(self, observations, memory, greedy=False):
        return np.zeros(len(observations), np.int64), memory

    def train_step(self, batch):
        return {"loss": float(batch["rewards"].mean())}

    def get_params(self):
        return {"w": np.zeros(2, np.float32)}

    def set_params(self, params):
        pass
'''
HEADER = "from dataclasses import dataclass\n\nimport gymnasium as gym\nimport numpy as np\n\nimport tinyverse\n"
NEW = f'''{HEADER}

@dataclass
class Args(tinyverse.Settings):
    session_length: int = 6
    """ticks a session, this file's default"""
    play_batch_size: int = 2
    local_params: tuple[str, ...] = ("w",)
    greedy: bool = False
    """an option of the file's own"""

{HOOKS}

class New(Still):
    def __init__(self, args: Args | None = None):
        super().__init__(args or Args())


def make_experiment(args: Args):
    return New(args)
'''
OLD = f"""{HEADER}
{HOOKS}

class Old(Still):
    session_length = 5  # the settings of an older file: class attributes
    play_batch_size = 3


def make_experiment(db):
    return Old(db)
"""


def write(tmp_path, name: str, source: str) -> str:
    path = tmp_path / name
    path.write_text(source)
    return str(path)


def stored_sessions(url: str, prefix: str) -> dict:
    db = connect(url, prefix)
    try:
        lo, hi = db.session_range()
        return db.get_batch(list(range(lo, hi + 1)))
    finally:
        db.close()


def test_set_sets_a_core_setting_of_an_options_dataclass_that_inherits_settings_end_to_end(tmp_path):
    path, url = write(tmp_path, "new.py", NEW), f"sqlite:///{tmp_path / 'runs.db'}"
    run_cli(path, "play", "-n", "2", "--db", url, "--set", "session_length=9", cwd=tmp_path, timeout=60)
    batch = stored_sessions(url, "new")
    assert batch["rewards"].shape == (4, 9), "2 rounds of the file's play_batch_size 2, of the --set length"
    db = connect(url, "new")
    assert db.setting("options")["session_length"] == 9 and db.setting("options")["prefetch"] == 2
    db.close()
    listed = run_cli(path, "play", "--help", "--db", url, cwd=tmp_path).stdout
    assert "session_length=6 (int, stored 9): ticks a session, this file's default" in listed  # the file's default
    assert "prefetch=2 (int): batches sampled ahead in a background thread" in listed  # the core's, its help
    assert "local_params=('w',) (tuple): params (globs)" in listed, "stored as a list: the same value"


def test_an_older_file_with_settings_as_class_attributes_and_make_experiment_db_still_plays(tmp_path):
    path, url = write(tmp_path, "old.py", OLD), f"sqlite:///{tmp_path / 'runs.db'}"
    run_cli(path, "play", "-n", "1", "--db", url, cwd=tmp_path, timeout=60)
    assert stored_sessions(url, "old")["rewards"].shape == (3, 5), "play -b from play_batch_size, T from the class"
    exp = load_experiment(path)
    assert exp.run.settings.session_length == 5 and exp.run.settings.prefetch == 2  # the class's, else the default
    assert exp.run.options is None and exp.run.args is None
    with pytest.raises(ExperimentError, match="takes no options"):
        load_experiment(path, None, {"session_length": "9"})


@pytest.mark.parametrize(
    "signature, call",
    [
        ("make_experiment(args: Args)", "New(args)"),
        ("make_experiment()", "New()"),
        ("make_experiment(db)", "New()"),
        ("make_experiment(db, args: Args)", "New(args)"),
    ],
)
def test_make_experiment_may_take_the_options_the_database_both_or_neither(tmp_path, signature, call):
    source = NEW.replace(
        "def make_experiment(args: Args):\n    return New(args)", f"def {signature}:\n    return {call}"
    )
    exp = load_experiment(write(tmp_path, "variant.py", source), None, {"greedy": "true"} if "args" in call else {})
    assert exp.run.settings.session_length == 6 and exp.run.settings.local_params == ("w",)
    assert (exp.run.options is not None) == ("args" in call)


def test_the_run_is_read_only_and_follows_the_runs_updates(db, tmp_path):
    exp = load_experiment(write(tmp_path, "new.py", NEW), db, {"greedy": "true", "train_batch_size": "2"})
    assert exp.run.args.greedy is True and exp.run.options["greedy"] is True
    assert exp.run.option_defaults["session_length"] == 6 and exp.run.options["local_params"] == ["w"]  # as JSON
    for name in ("settings", "options", "option_defaults", "updates", "args", "anything"):
        with pytest.raises(AttributeError):
            setattr(exp.run, name, 3)
    with pytest.raises(AttributeError):
        exp.run = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        exp.run.settings.session_length = 3
    with pytest.raises(AttributeError):
        exp.update_count = 3
    play(exp, db, batch_size=2, rounds=1)  # stores the player's params: version 1
    db.add_to_counter("updates", 7)  # a trainer elsewhere
    db.save_params(exp.get_params(), 2, expect=1)
    play(exp, db, batch_size=2, rounds=1)  # loads version 2: the run's update count with it
    assert exp.run.updates == 7 and exp.update_count == 7
    train(exp, db, batch_size=2, updates=3, save_every=100)
    assert exp.run.updates == 9, "set before each of the 3 updates (of train_batch_size): the run's count before it"


def test_options_and_an_attribute_that_disagree_on_a_setting_are_one_line(tmp_path):
    agree = NEW.replace(
        "        super().__init__(args or Args())",
        "        super().__init__(args or Args())\n        self.session_length = 6",
    )
    assert load_experiment(write(tmp_path, "agree.py", agree)).run.settings.session_length == 6
    with pytest.raises(ExperimentError) as e:
        load_experiment(write(tmp_path, "agree.py", agree), None, {"session_length": "8"})
    assert str(e.value) == (
        "the experiment's session_length is 6, its options' 8: set it in the options alone (tinyverse.Settings)"
    )


def test_an_experiment_made_in_process_reads_its_settings_from_the_options_it_was_given(tmp_path, db):
    module = import_file(write(tmp_path, "new.py", NEW))
    exp = module.New(module.Args(session_length=4))
    assert exp.run.settings.session_length == 4 and exp.run.options is None  # nothing to store without the loader
    assert play(exp, db, rounds=1) == 1 and db.get_batch([1])["rewards"].shape == (1, 4)
    exp.run.args.session_length = 3  # the options are the one place: read again at each loop's start
    assert exp.run.settings.session_length == 3


def test_every_setting_is_checked_and_listed_with_its_help():
    assert set(SETTINGS) == set(NAMES), "tinyverse/declared.py checks each setting, no other"

    def make_experiment(args: tinyverse.Settings):
        pass

    lines = describe(make_experiment)
    assert [line.split("=")[0] for line in lines] == NAMES
    assert all(re.fullmatch(r"\w+=\S+ \([^()]*\): .+", line) for line in lines), "a docstring under each field"


def test_local_params_are_set_as_comma_separated_globs_and_survive_the_json_of_the_stored_options(tmp_path, db):
    path = write(tmp_path, "new.py", NEW)
    first = load_experiment(path, db)
    store(first.run, db)
    later = load_experiment(path, db)  # adopts the stored options: a list where the file says a tuple
    store(later.run, db)
    assert later.run.settings.local_params == ["w"] and np.array_equal(later.get_params()["w"], np.zeros(2))
    assert load_experiment(path, db, {"local_params": "w"}).run.settings.local_params == ["w"]  # the stored: fine
    with pytest.raises(ExperimentError, match="conflicts with local_params=\\['w'\\]"):
        load_experiment(path, db, {"local_params": "target.*,w"})
    assert load_experiment(path, None, {"local_params": "target.*,w"}).run.settings.local_params == ["target.*", "w"]
