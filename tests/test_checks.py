"""The contract, from the hostile side: what each hook returns is checked, a hook's error names the hook and shows
the user's frames, the experiment's settings and observation space are refused before anything is stored, and a
player making its environments still hears a stop. In-process with small hostile experiments, and via the CLI."""

import logging
import re
import signal
import textwrap
import time

import gymnasium as gym
import numpy as np
import pytest
from conftest import ROOT, run_cli, spawn, wait_for
from fake_experiment import FakeExperiment

from tinyverse import checks, declared
from tinyverse.database import connect
from tinyverse.errors import ExperimentError
from tinyverse.evaluation import evaluate
from tinyverse.every import Every
from tinyverse.loader import load_experiment
from tinyverse.player import play
from tinyverse.trainer import train

FAKE = ROOT / "tests" / "fake_experiment.py"
STEP = "a Gymnasium env returns (observation, reward, terminated, truncated, info)"


@pytest.fixture
def db(tmp_path):
    """SQLite alone: a hook's return is checked before any backend sees it."""
    database = connect(f"sqlite:///{tmp_path / 'checks.db'}", "checks")
    yield database
    database.close()


def refused(run, exp, db) -> str:
    """The one line ``run(exp, db)`` raises, once nothing is stored but the params a player seeds."""
    with pytest.raises(ExperimentError) as e:
        run(exp, db)
    assert "\n" not in str(e.value), str(e.value)
    assert db.count_sessions() == (0, 0), "a session was stored"
    return str(e.value)


def one_round(exp, db):
    return play(exp, db, batch_size=2, rounds=1)


class Returns(gym.Wrapper):
    """An env whose step or reset returns what ``change`` makes of the real return."""

    def __init__(self, env, step=None, reset=None):
        super().__init__(env)
        self.change_step = step
        self.change_reset = reset

    def step(self, action):
        found = self.env.step(action)
        return self.change_step(found) if self.change_step else found

    def reset(self, **kwargs):
        found = self.env.reset(**kwargs)
        return self.change_reset(found) if self.change_reset else found


def with_env(exp, **changes):
    make = exp.make_env
    exp.make_env = lambda render_mode=None: Returns(make(render_mode), **changes)
    return exp


# -- 1. what each hook returns -------------------------------------------------------------------------------------
ITEMS = "return (actions, memory) with actions a NumPy array of 2 items"


@pytest.mark.parametrize(
    "returned, problem",
    [
        (lambda a, m: (None, m), f"act returned actions of type NoneType: {ITEMS}"),
        (lambda a, m: (np.int64(1), m), f"act returned actions of type int64: {ITEMS}"),
        (lambda a, m: (np.array(["left", "right"]), m), f"act returned actions of shape (2,) dtype <U5: {ITEMS}"),
        (lambda a, m: (np.zeros(3, np.int64), m), f"act returned actions of shape (3,) dtype int64: {ITEMS}"),
        (lambda a, m: a, "act returned type ndarray: return (actions, memory[, outputs])"),
        (lambda a, m: (a, [1, 2]), "act returned memory of type list: memory is a dict of arrays"),
        (
            lambda a, m: (a, {"steps": np.zeros(3)}),
            "act returned memory.steps of shape (3,): memory is batched, (2, ...)",
        ),
        (lambda a, m: (a, {}), "act returned memory named none; keep the names initial_memory returned: steps"),
    ],
)
def test_what_act_returns_is_checked(db, returned, problem):
    exp = FakeExperiment(db)
    act = exp.act
    exp.act = lambda o, m, greedy=False: returned(*act(o, m, greedy))
    assert refused(one_round, exp, db) == problem


def test_act_is_checked_cheaply_after_its_first_return_and_in_full_when_it_changes(db):
    exp, calls = FakeExperiment(db), []
    act = exp.act

    def changes(o, m, greedy=False):  # good for four ticks, then the actions of one environment only
        calls.append(1)
        actions, memory = act(o, m, greedy)
        return (actions if len(calls) <= 4 else actions[:1]), memory

    exp.act = changes
    assert refused(one_round, exp, db) == f"act returned actions of shape (1,) dtype int64: {ITEMS}"
    assert len(calls) == 5


def test_evaluate_checks_act_alike(db):
    exp = FakeExperiment(db)
    exp.act = lambda o, m, greedy=False: (None, m)
    with pytest.raises(ExperimentError, match="^act returned actions of type NoneType: .* array of 1 items$"):
        evaluate(exp, db, episodes=1)


@pytest.mark.parametrize(
    "changes, problem",
    [
        ({"step": lambda s: (s[0], "1.0", *s[2:])}, f"env.step returned a reward of type str: {STEP}"),
        ({"step": lambda s: s[:4]}, f"env.step returned 4 items: {STEP}"),
        ({"step": lambda s: (*s[:2], None, *s[3:])}, f"env.step returned terminated None: {STEP}, with bools"),
        ({"reset": lambda r: r[0]}, "env.reset returned type ndarray: a Gymnasium env returns (obs, info)"),
    ],
)
def test_what_the_env_returns_is_checked(db, changes, problem):
    assert refused(one_round, with_env(FakeExperiment(db), **changes), db) == problem


def test_uncommon_but_sound_rewards_and_flags_are_taken(db):
    # a 0-d array reward, flags as 0 and 1 (older envs): the slow path looks closer, and takes them
    exp = with_env(FakeExperiment(db, max_steps=5), step=lambda s: (s[0], np.array(2.0), int(s[2]), int(s[3]), {}))
    assert play(exp, db, batch_size=2, rounds=2) == 4
    batch = db.get_batch([1, 2, 3, 4])
    assert (batch["rewards"] == 2.0).all() and batch["truncated"].any()


@pytest.mark.parametrize(
    "hook, returned, problem",
    [
        ("session_info", lambda: "eps", "session_info returned type str: return a dict of numbers"),
        ("session_info", lambda: {"eps": "0.1"}, "session_info returned 'eps' of type str: return numbers"),
        ("initial_memory", lambda b: [0] * b, "initial_memory returned memory of type list: memory is a dict"),
        ("initial_memory", lambda b: {"h": np.zeros(1)}, "initial_memory returned memory.h of shape (1,)"),
        ("get_params", lambda: [np.zeros(2)], "get_params returned type list: return a dict of NumPy arrays"),
        ("get_params", lambda: {"w": [[0.5]]}, "get_params returned 'w' of type list: params are NumPy arrays"),
        ("make_env", lambda render_mode=None: "CartPole-v1", "make_env returned type str: return a gymnasium.Env"),
    ],
)
def test_what_the_players_other_hooks_return_is_checked(db, hook, returned, problem):
    exp = FakeExperiment(db)
    setattr(exp, hook, returned)
    assert refused(one_round, exp, db).startswith(problem)
    if hook == "get_params":
        assert db.params_version() is None, "params of the wrong kind were stored"


def test_what_the_trainers_hooks_return_is_checked(db):
    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    version = db.params_version()
    cases = [
        ("train_step", lambda batch: 0.5, 2, "train_step returned type float: return a dict of numbers"),
        ("train_step", lambda batch: {"loss": [0.5]}, 2, "train_step returned 'loss' of type list"),
        ("sample", lambda db, b: [np.zeros(2)], 2, "sample returned type list: return sessions as db.sample_batch"),
        ("sample", lambda db, b: {"obs": np.zeros(2)}, 0, "sample returned a dict of obs: return sessions as"),
    ]
    for hook, returned, prefetch, problem in cases:
        exp = FakeExperiment(db)
        exp.prefetch = prefetch  # from the prefetch thread, or the training thread: raised alike
        setattr(exp, hook, returned)
        with pytest.raises(ExperimentError) as e:
            train(exp, db, batch_size=2, updates=3)
        assert str(e.value).startswith(problem) and "\n" not in str(e.value), str(e.value)
        assert db.params_version() == version, "a trainer that broke the contract published"
        assert not db.workers(), "the trainer did not leave"


def test_metrics_and_returns_of_any_number_type_are_taken_and_a_nan_metric_is_logged(db, caplog, monkeypatch):
    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    exp = FakeExperiment(db)
    monkeypatch.setattr(checks, "say", Every(60.0))  # said at most once a minute: a fresh clock for this test
    exp.train_step = lambda batch: {"loss": np.float32("nan"), "n": np.int64(3), "none": True}
    with caplog.at_level(logging.WARNING, "tinyverse.checks"):
        train(exp, db, batch_size=2, updates=2, save_every=100)
    warned = [r.getMessage() for r in caplog.records if r.name == "tinyverse.checks"]
    assert len(warned) == 1 and "'loss': nan" in warned[0] and "at update 1 of the run" in warned[0], warned
    assert db.metrics("train")[-1]["n"] == 3.0


# -- 2. an error inside a hook -------------------------------------------------------------------------------------
def boom(*args, **kwargs):
    raise ValueError("no\n  way")


def in_trainer(hook):
    def run(exp, db):
        play(FakeExperiment(db), db, batch_size=2, rounds=2)
        setattr(exp, hook, boom)
        train(exp, db, batch_size=2, updates=2)

    return run


def in_player(hook):
    def run(exp, db):
        if hook == "set_params":
            db.save_params(exp.get_params())
        if hook == "env.step":
            return play(with_env(exp, step=boom), db, rounds=1)
        setattr(exp, hook, boom)
        play(exp, db, rounds=1)

    return run


@pytest.mark.parametrize(
    "hook, run",
    [(h, in_player(h)) for h in ("make_env", "env.step", "act", "initial_memory", "session_info", "get_params")]
    + [("set_params", in_player("set_params"))]
    + [(h, in_trainer(h)) for h in ("prepare_training", "sample", "train_step")],
)
def test_an_error_in_any_hook_is_a_line_naming_it_then_the_users_frames_only(db, hook, run):
    with pytest.raises(ExperimentError) as e:
        run(FakeExperiment(db), db)
    first, *frames = str(e.value).splitlines()
    assert first == f"{hook} raised ValueError: no way"  # the hook's own lines: one
    files = [line.strip() for line in frames if line.startswith("  File ")]
    assert files and all(f.startswith(f'File "{__file__}"') for f in files), frames  # the test's alone
    assert files[-1].endswith("in boom"), frames


BROKEN = """
    import sys
    sys.path.insert(0, {tests!r})
    from fake_experiment import FakeExperiment


    def policy(x):
        return x / 0


    class Broken(FakeExperiment):
        def act(self, observations, memory, greedy=False):
            return policy(1), memory


    def make_experiment(db):
        return Broken(db)
"""


def test_the_cli_prints_the_hooks_line_and_the_users_frames_and_exits_1(tmp_path):
    exp = tmp_path / "broken.py"
    exp.write_text(textwrap.dedent(BROKEN.format(tests=str(ROOT / "tests"))))
    proc = run_cli(exp, "play", "-n", "1", "-q", "--db", f"sqlite:///{tmp_path / 'run.db'}", cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    first, *frames = proc.stderr.strip().splitlines()
    assert first == "tinyverse: error: act raised ZeroDivisionError: division by zero"
    files = [line.split('"')[1] for line in frames if line.startswith("  File ")]
    assert files == [str(exp), str(exp)], frames  # act, then policy: the user's, and nothing of tinyverse's
    assert "return x / 0" in frames[-1] or "return x / 0" in frames[-2]


# -- 3. what the experiment declares -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "name, value",
    [
        ("session_length", 0),
        ("session_length", 100_001),
        ("session_length", 2.5),
        ("session_length", True),
        ("play_batch_size", 0),
        ("train_batch_size", "4"),
        ("buffer_size", 0),
        ("prefetch", -1),
        ("save_every", 0),
        ("batch_per_player", "yes"),
        ("local_params", "target"),
        ("updates_per_step", 0.0),
        ("updates_per_step", float("nan")),
        ("learning_starts", -1),
        ("pace_slack", -5),
    ],
)
def test_a_bad_setting_is_one_line_naming_it_before_anything_is_stored(db, name, value):
    exp = FakeExperiment(db)
    setattr(exp, name, value)
    pace = "bad pace: " if name in ("updates_per_step", "learning_starts", "pace_slack") else ""
    for run in (one_round, lambda exp, db: train(exp, db, batch_size=2, updates=1)):
        assert refused(run, exp, db).startswith(f"{pace}the experiment's {name} is {value!r}, not ")
    assert db.params_version() is None and not db.workers()


def test_sound_settings_of_other_number_types_pass():
    exp = FakeExperiment(session_length=np.int64(5), updates_per_step=1)
    exp.buffer_size = None
    exp.local_params = ["target*"]
    declared.check(exp)


def test_a_bad_option_is_refused_at_load_and_never_stored(tmp_path, db):
    with pytest.raises(ExperimentError, match="^the experiment's session_length is 0, not a whole number from 1 to"):
        load_experiment(str(FAKE), db, {"session_length": "0"})
    assert db.setting("options") is None
    # the case: stored, every later player adopted it and crashed until clear --all
    url = f"sqlite:///{tmp_path / 'run.db'}"
    proc = run_cli(FAKE, "play", "-n", "1", "--db", url, "--set", "session_length=0", check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "tinyverse: error: the experiment's session_length is 0, not a whole number" in proc.stderr
    run_cli(FAKE, "play", "-n", "1", "-q", "--db", url)  # the corrected command just works
    stored = connect(url, "fake_experiment")
    assert stored.setting("options")["session_length"] == 8
    stored.close()


class Observes(gym.Env):
    """An env observing ``space``, which counts its resets and steps."""

    def __init__(self, space):
        self.observation_space = space
        self.action_space = gym.spaces.Discrete(2)
        self.calls = 0

    def reset(self, *, seed=None, options=None):
        self.calls += 1
        return self.observation_space.sample(), {}

    def step(self, action):
        self.calls += 1
        return self.observation_space.sample(), 0.0, False, False, {}


BOX = gym.spaces.Box(-1, 1, (2,))
RECORDS = "tinyverse records Box, Discrete, MultiBinary, MultiDiscrete, in Dicts and Tuples"
FLATTEN = f"{RECORDS}; wrap the env in gymnasium.wrappers.FlattenObservation"
ENCODE = f"{RECORDS}; encode it as arrays with a gymnasium.ObservationWrapper"
KEYS = "(keys are names without '.', not numbers)"


@pytest.mark.parametrize(
    "space, problem",
    [
        (gym.spaces.Text(8), f"a Text space: {FLATTEN}"),
        (gym.spaces.Sequence(BOX), f"a Sequence space: {ENCODE}"),
        (gym.spaces.Graph(BOX, None), f"a Graph space: {ENCODE}"),
        (
            gym.spaces.Dict(pos=BOX, note=gym.spaces.Text(8)),
            f"a Dict space whose observations.note is a Text space: {FLATTEN}",
        ),
        (
            gym.spaces.Tuple((BOX, gym.spaces.Dict(path=gym.spaces.Sequence(BOX)))),
            f"a Tuple space whose observations.1.path is a Sequence space: {ENCODE}",
        ),
        (
            gym.spaces.Dict({"a.b": BOX}),
            f"a Dict space keyed 'a.b' {KEYS}: {FLATTEN}",
        ),
        (gym.spaces.Dict({"0": BOX}), f"a Dict space keyed '0' {KEYS}: {FLATTEN}"),
        (gym.spaces.Tuple(()), f"an empty Tuple space: {ENCODE}"),
    ],
)
def test_an_observation_space_tinyverse_cannot_record_is_refused_before_the_first_step(db, space, problem):
    env = Observes(space)
    exp = FakeExperiment(db)
    exp.make_env = lambda render_mode=None: env
    assert refused(one_round, exp, db) == f"make_env's env observes {problem}"
    with pytest.raises(ExperimentError, match=re.escape(problem.split(":")[0])):
        evaluate(exp, db, episodes=1)
    assert env.calls == 0 and db.params_version() is None


# -- 5. a player making many environments hears a stop -------------------------------------------------------------
def test_sigterm_stops_a_player_between_its_environments(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    db = connect(url, "fake_experiment")
    player = spawn(FAKE, "play", "-b", "10000", "--db", url, cwd=tmp_path)  # seconds of gym.make
    wait_for(lambda: db.workers() or not player.alive(), 60, "the player to register")  # then it makes envs
    start = time.monotonic()
    assert player.stop(timeout=10, sig=signal.SIGTERM) == 0, player.stderr()
    assert time.monotonic() - start < 2.0, "a stop waited for the environments"
    assert "got SIGTERM" in player.stderr()
    assert db.setting("options") is None and db.count_sessions() == (0, 0) and not db.workers()
    db.close()
