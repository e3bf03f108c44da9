"""The runner end to end: real ``python -m tinyverse`` subprocesses on real databases."""

import os
import re
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import REDIS_PASSWORD, Proc, cli_env, free_port, run_cli, sets, spawn, wait_for

from tinyverse import readable
from tinyverse.cli import main
from tinyverse.database import connect
from tinyverse.encoding import decode

EXP = Path(__file__).resolve().parent / "fake_experiment.py"
PREFIX = EXP.stem  # the default prefix: the experiment's name
SESSION_KEYS = {"observations", "final_observations", "actions", "rewards", "terminated", "truncated"}


class Fleet:
    """Starts processes, waits on conditions with a deadline, and kills whatever is left."""

    def __init__(self, cwd: Path):
        self.cwd, self.procs = cwd, []

    def start(self, *args, **options) -> Proc:
        args = (*args, *sets(**options))
        proc = spawn(*args, cwd=self.cwd, name=f"{args[1] if len(args) > 1 else 'p'}-{len(self.procs)}")
        self.procs.append(proc)
        return proc

    def wait(self, condition, what: str, timeout: float = 60.0, alive: tuple[Proc, ...] = ()):
        """Poll ``condition`` until true; fail early if a process in ``alive`` exits."""

        def ready():
            dead = [p for p in alive if not p.alive()]
            assert not dead, f"{dead[0].name} exited with {dead[0].p.returncode} waiting for {what}\n{self.logs()}"
            return condition()

        wait_for(ready, timeout, lambda: f"{what}\n{self.logs()}")

    def exit(self, proc: Proc, timeout: float = 60.0) -> int:
        try:
            return proc.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{proc.name} did not exit within {timeout}s\n{self.logs()}") from None

    def logs(self) -> str:
        return "\n".join(f"--- {p.name} stderr:\n{p.stderr()[-3000:]}" for p in self.procs)

    def close(self):
        for p in self.procs:
            p.kill()


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path)
    yield f
    f.close()


def cli(*args, cwd, check=True, timeout=120, env=None, **options) -> subprocess.CompletedProcess:
    """``python -m tinyverse ARGS`` with ``--set name=value`` for each of ``options``."""
    return run_cli(*args, *sets(**options), cwd=cwd, check=check, timeout=timeout, env=env)


def one_error_line(proc: subprocess.CompletedProcess | str) -> str:
    """The single line an error path prints on stderr (and nothing else: no traceback, no logs)."""
    err = proc if isinstance(proc, str) else proc.stderr
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got:\n{err}"
    assert lines[0].startswith("tinyverse: error: "), lines[0]
    return lines[0]


def sqlite_db(tmp_path: Path, prefix: str = PREFIX):
    return connect(f"sqlite:///{tmp_path / 'tinyverse.db'}", prefix, retry_for=10)


def check_sqlite_file(path: Path, prefix: str = PREFIX) -> int:
    """integrity_check is ok and every stored session decodes; returns how many are stored."""
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        rows = conn.execute(f'SELECT data FROM "{prefix}:sessions"').fetchall()
    for (blob,) in rows:
        s = decode(blob)
        assert SESSION_KEYS <= s.keys() and s["observations"].shape[0] == s["actions"].shape[0] + 1
    return len(rows)


@pytest.fixture(scope="module")
def unreachable(tmp_path_factory):
    """An eval, a player and a trainer against a closed port, started early so that the eval's retry window
    overlaps other tests: the eval gives up, the player and trainer wait for ever."""
    cwd = tmp_path_factory.mktemp("unreachable")
    port = free_port()  # nothing listens here
    url = f"redis://127.0.0.1:{port}/0"
    procs = {
        "eval": Proc([EXP, "eval", "-n", "1", "--no-record", "--db", url], cwd, cli_env(), "eval"),
        "play": Proc([EXP, "play", "--db", url], cwd, cli_env(), "play"),
        "train": Proc([EXP, "train", "--db", url], cwd, cli_env(), "train"),
    }
    yield procs, port
    for proc in procs.values():
        proc.kill()


# -- help --------------------------------------------------------------------------------------------------------------
def test_help_explains_every_mode_and_flag(tmp_path):
    top = cli("--help", cwd=tmp_path).stdout
    for mode in ("play", "train", "eval", "clear", "info"):
        assert re.search(rf"^\s+{mode}\s+\w", top, re.M), f"top-level --help does not describe {mode}"
    flags = {
        "play": ["--batch-size", "--rounds", "--sync-every", "--buffer-size", "--seed", "--set", "--device"],
        "train": ["--batch-size", "--updates", "--save-every", "--buffer-size", "--set", "--device"],
        "run": ["--players", "--trainers", "--steps", "--target-return", "--eval-episodes", "--set"],
        "eval": ["--episodes", "--record", "--no-record", "--seed", "--set"],
        "clear": ["--all", "--del-sessions", "--del-weights", "--del-metrics", "--kill-players", "--kill-trainers"],
        "info": [],
    }
    for mode, names in flags.items():
        out = cli(EXP, mode, "--help", cwd=tmp_path).stdout
        for flag in [*names, "--db", "--prefix", "--host", "--port", "--password"]:
            assert len(option_help(out, flag).split()) >= 2, f"{mode} --help does not explain {flag}:\n{out}"


def option_help(text: str, flag: str) -> str:
    """The help text argparse shows for ``flag``: after its invocation, maybe on the lines below."""
    lines = text.splitlines()
    for n, line in enumerate(lines):
        invocation, _, rest = line.strip().partition("  ")
        if line.lstrip().startswith("-") and flag in re.split(r"[ ,]+", invocation):
            more = []
            for below in lines[n + 1 :]:
                if not below.strip() or below.lstrip().startswith("-"):
                    break
                more.append(below.strip())
            return " ".join([rest.strip(), *more])
    return ""


# -- play and train together, then eval --------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_play_and_train_together_then_eval(backend, tmp_path, fleet, request):
    if backend == "sqlite":  # the default database: ./tinyverse.db
        where, db = [], sqlite_db(tmp_path)
    else:
        url, prefix = request.getfixturevalue("redis_url"), request.getfixturevalue("prefix")
        where, db = ["--db", url, "--prefix", prefix], connect(url, prefix, retry_for=10)
    knobs = dict(session_length=8, max_steps=50)
    trainer = fleet.start(EXP, "train", "-b", 4, "-n", 30, "-s", 10, *where, **knobs)
    player = fleet.start(EXP, "play", "-b", 2, "-n", 25, *where, **knobs)
    assert fleet.exit(player) == 0, fleet.logs()
    assert fleet.exit(trainer) == 0, fleet.logs()
    assert db.count_sessions() == (50, 50)
    version, params = db.load_params()
    assert params["updates"][0] == 30, "30 updates, all published"
    assert version == 4, "the first init, then 3 publishes"
    assert db.metrics("episodes"), "players report episode returns"
    assert db.metrics("train"), "trainers report metrics"
    assert db.workers() == [], "workers that exit leave the list"

    ev = cli(EXP, "eval", "-n", 2, "--no-record", *where, cwd=tmp_path, **knobs)
    returns = [float(r) for r in re.findall(r"^episode \d/2: return (\S+), length \d+$", ev.stdout, re.M)]
    assert len(returns) == 2, ev.stdout
    assert f"mean return {readable.mean(returns)} (params v{version})" in ev.stdout
    assert not list(tmp_path.glob("records/*")), "--no-record writes no video"


def test_eval_records_a_video_of_each_episode(tmp_path):
    sqlite_db(tmp_path)  # eval refuses to create a database
    ev = cli(EXP, "eval", "-n", 2, "--record", "videos", cwd=tmp_path, max_steps=15)
    videos = sorted((tmp_path / "videos").glob("*.mp4"))
    assert len(videos) == 2, ev.stdout + ev.stderr
    for v in videos:
        head = v.read_bytes()[:12]
        assert head[4:8] == b"ftyp", f"{v} is not an mp4"
        assert str(v.relative_to(tmp_path)) in ev.stdout
    assert "mean return" in ev.stdout


# -- unreachable Redis, part 1 (the eval of part 2 gives up meanwhile) -------------------------------------------------
def test_unreachable_redis_makes_play_and_train_wait_with_a_message(unreachable, fleet):
    procs, port = unreachable
    url = f"redis://127.0.0.1:{port}/0"
    for proc in (procs["play"], procs["train"]):
        fleet.wait(lambda p=proc: "unreachable" in p.stderr(), f"{proc.name} to say it waits", alive=(proc,))
        assert "waiting" in proc.stderr() and url in proc.stderr()
        assert "Traceback" not in proc.stderr()
    # that they go on waiting is checked in part 2: they outlive the eval, which gives up


# -- kill -9 -----------------------------------------------------------------------------------------------------------
def test_player_killed_with_sigkill_restarts_and_continues(tmp_path, fleet):
    db = sqlite_db(tmp_path)
    first = fleet.start(EXP, "play", "-b", 2)
    fleet.wait(lambda: db.count_sessions()[0] >= 20, "sessions", alive=(first,))
    params_before = db.load_params()
    first.stop(sig=signal.SIGKILL)
    assert "random init" in first.stderr() or "no params" in first.stderr()

    stored = check_sqlite_file(tmp_path / "tinyverse.db")
    assert stored >= 20
    version, params = db.load_params()
    assert version == params_before[0] == 1
    for k in params:
        np.testing.assert_array_equal(params[k], params_before[1][k])

    second = fleet.start(EXP, "play", "-b", 2)
    fleet.wait(lambda: db.count_sessions()[0] >= stored + 20, "sessions after the restart", alive=(second,))
    assert second.stop(sig=signal.SIGTERM) == 0, second.stderr()
    assert "no params" not in second.stderr(), "a restarted player must not re-seed params"
    assert db.params_version() == 1, "players never overwrite params"
    check_sqlite_file(tmp_path / "tinyverse.db")


def test_trainer_killed_with_sigkill_resumes_from_published_params(tmp_path, fleet):
    db = sqlite_db(tmp_path)
    knobs = dict(train_sleep=0.01)
    player = fleet.start(EXP, "play", "-b", 2, **knobs)
    fleet.wait(lambda: db.params_version() is not None, "the initial params", alive=(player,))
    init = db.load_params()[1]
    assert init["updates"][0] == 0
    trainer = fleet.start(EXP, "train", "-b", 4, "-s", 5, **knobs)
    fleet.wait(lambda: (db.params_version() or 0) >= 4, "three publishes", alive=(player, trainer))
    before = db.params_version()
    trainer.stop(sig=signal.SIGKILL)  # mid-run: during a step, a sample or a save

    check_sqlite_file(tmp_path / "tinyverse.db")
    version, params = db.load_params()
    assert version >= before >= 4, "the params version went back"
    # each publish adds 5 updates to the counter: a half-written or reset params set would break this
    assert params["updates"][0] == 5 * (version - 1)
    np.testing.assert_array_equal(params["w"], init["w"])

    again = fleet.start(EXP, "train", "-b", 4, "-s", 5, **knobs)
    fleet.wait(lambda: db.params_version() >= version + 2, "publishes after the restart", alive=(player, again))
    assert f"resuming from params version {version}" in again.stderr()
    now, params = db.load_params()
    assert params["updates"][0] == 5 * (now - 1), "the restarted trainer did not resume from the stored params"
    np.testing.assert_array_equal(params["w"], init["w"])  # never replaced by a new random init
    again.stop(sig=signal.SIGKILL)
    assert player.alive(), fleet.logs()
    check_sqlite_file(tmp_path / "tinyverse.db")


def test_sigterm_makes_the_trainer_publish_and_exit_0(tmp_path, fleet):
    db = sqlite_db(tmp_path)
    progress = tmp_path / "progress"
    knobs = dict(progress=progress, train_sleep=0.005)
    cli(EXP, "play", "-b", 2, "-n", 3, cwd=tmp_path, **knobs)
    start = db.params_version()
    trainer = fleet.start(EXP, "train", "-b", 2, "-s", 100000)  # adopts the options of the run
    fleet.wait(lambda: progress.exists() and int(progress.read_text() or 0) >= 3, "updates", alive=(trainer,))
    assert db.params_version() == start, "nothing published before -s updates"
    assert trainer.stop(sig=signal.SIGTERM) == 0, trainer.stderr()
    assert "SIGTERM" in trainer.stderr()
    version, params = db.load_params()
    assert version == start + 1, "a warm shutdown publishes once"
    assert params["updates"][0] >= 3
    assert db.workers() == []


# -- error paths -------------------------------------------------------------------------------------------------------
def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


ERRORS = {
    "missing file": (lambda d: ["nope.py", "play"], ["nope.py", "not found"]),
    "syntax error": (lambda d: [write(d / "bad.py", "x = 1\ndef (:\n"), "play"], ["bad.py:2", "syntax error"]),
    "no make_experiment": (lambda d: [write(d / "empty.py", "x = 1\n"), "train"], ["empty.py", "make_experiment"]),
    "unknown mode": (lambda d: [EXP, "dance"], ["dance", "play"]),
    "unknown db scheme": (lambda d: [EXP, "info", "--db", "mysql://localhost/x"], ["mysql://", "sqlite:///"]),
    "nothing to clear": (lambda d: [EXP, "clear"], ["--all", "--del-", "--kill-"]),
}


@pytest.mark.parametrize("case", ERRORS)
def test_bad_input_gives_one_clear_line_and_a_nonzero_exit(case, tmp_path):
    args, words = ERRORS[case]
    proc = cli(*args(tmp_path), cwd=tmp_path, check=False)
    assert proc.returncode != 0
    line = one_error_line(proc)
    for w in words:
        assert w in line, f"{w!r} missing from: {line}"


def test_params_of_another_shape_are_refused_and_kept(tmp_path):
    db = sqlite_db(tmp_path)
    foreign = {"w": np.ones((5, 2), np.float32), "updates": np.zeros(1, np.int64)}  # another model's params
    version = db.save_params(foreign)
    for mode in ("train", "play"):
        proc = cli(EXP, mode, "-n", 1, cwd=tmp_path, check=False)
        assert proc.returncode != 0
        line = one_error_line(proc)
        assert "w: stored float32[5, 2], model wants float32[4, 2]" in line
        assert "--prefix" in line and "clear --del-params" in line
    assert db.params_version() == version
    np.testing.assert_array_equal(db.load_params()[1]["w"], foreign["w"])


# -- clear -------------------------------------------------------------------------------------------------------------
def populate(db) -> None:
    session = {"observations": np.zeros((3, 4), np.float32), "actions": np.zeros(2, np.int64)}
    db.add_sessions([session] * 5, capacity=100)
    db.save_params({"w": np.ones((4, 2), np.float32), "updates": np.zeros(1, np.int64)})
    db.add_metrics("episodes", [{"return": 10.0, "time": time.time(), "steps": 10}])
    db.add_metrics("train", [{"loss": 1.0}])
    db.heartbeat("player-elsewhere-1", {"id": "player-elsewhere-1", "role": "player", "host": "elsewhere", "pid": 1})


def contents(db) -> dict:
    return {
        "sessions": db.count_sessions()[0],
        "params": db.params_version() is not None,
        "metrics": len(db.metrics("episodes")) + len(db.metrics("train")),
    }


def test_clear_deletes_what_it_says_and_leaves_the_rest(tmp_path):
    db, other = sqlite_db(tmp_path), sqlite_db(tmp_path, "other")
    populate(db)
    populate(other)
    full = {"sessions": 5, "params": True, "metrics": 2}
    assert contents(db) == full

    cli(EXP, "clear", "--del-sessions", cwd=tmp_path)
    assert contents(db) == {**full, "sessions": 0}
    cli(EXP, "clear", "--del-metrics", cwd=tmp_path)
    assert contents(db) == {**full, "sessions": 0, "metrics": 0}
    cli(EXP, "clear", "--del-weights", cwd=tmp_path)
    assert contents(db) == {"sessions": 0, "params": False, "metrics": 0}
    assert contents(other) == full, "clear with an experiment touches its namespace only"

    populate(db)
    cli("clear", "--all", cwd=tmp_path)  # no experiment: every namespace
    for d in (db, other):
        assert contents(d) == {"sessions": 0, "params": False, "metrics": 0}
        assert d.workers() == []


def test_clear_kill_players_stops_a_live_player_but_not_a_reused_pid(tmp_path, fleet):
    db = sqlite_db(tmp_path)
    player = fleet.start(EXP, "play", "-b", 1)
    fleet.wait(lambda: any(w["pid"] == player.pid for w in db.workers()), "the player's heartbeat", alive=(player,))
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with open(f"/proc/{bystander.pid}/cmdline", "rb") as f:
            cmdline = f.read().decode().split("\0")[:-1]
        # a stale record whose PID now belongs to another process: same PID, another start time
        forged = {"id": "player-forged", "role": "player", "host": socket.gethostname(), "pid": bystander.pid}
        db.heartbeat("player-forged", {**forged, "proc_start": "1", "cmdline": cmdline, "started": time.time()}, 60)

        out = cli(EXP, "clear", "--kill-players", cwd=tmp_path).stdout
        assert f"stopped player pid {player.pid}" in out
        assert f"player pid {bystander.pid}" in out and "left alone" in out
        assert fleet.exit(player, timeout=30) == 0, "a player asked to stop shuts down warmly"
        assert bystander.poll() is None, "clear killed a process that merely reuses a registered PID"
        assert all(w["pid"] != player.pid for w in db.workers()), "the stopped player's heartbeat is still there"
    finally:
        bystander.kill()
        bystander.wait()


# -- a Redis server that goes away and comes back ----------------------------------------------------------------------
def test_player_waits_for_a_restarted_redis_and_goes_on(redis_server, fleet):
    db = connect(redis_server.url, PREFIX, retry_for=30)
    player = fleet.start(EXP, "play", "-b", 2, "--db", redis_server.url)
    fleet.wait(lambda: db.count_sessions()[0] >= 4, "sessions", alive=(player,))
    redis_server.stop()
    fleet.wait(lambda: "unreachable" in player.stderr(), "the player to say it waits", alive=(player,))
    assert "Traceback" not in player.stderr()
    redis_server.start()  # an empty server on the same port: its data went with the old one
    fleet.wait(lambda: db.count_sessions()[0] >= 4, "sessions after the restart", alive=(player,))
    fleet.wait(lambda: "is back" in player.stderr(), "the player to say the database is back", alive=(player,))
    assert player.stop(sig=signal.SIGTERM) == 0, player.stderr()
    assert "Traceback" not in player.stderr()


# -- unreachable Redis, part 2 -----------------------------------------------------------------------------------------
def test_unreachable_redis_makes_eval_give_up_with_one_error(unreachable):
    procs, port = unreachable
    proc = procs["eval"]
    try:
        code = proc.p.wait(timeout=120)  # eval retries for a bounded window, then gives up
    except subprocess.TimeoutExpired:
        raise AssertionError(f"eval against a closed port still runs after 120 s:\n{proc.stderr()}") from None
    assert code != 0
    err = proc.stderr()
    assert "Traceback" not in err, err
    *logged, last = err.strip().splitlines()
    assert last.startswith("tinyverse: error: "), err
    assert f"127.0.0.1:{port}" in last and "--db sqlite:///" in last, last
    assert all(" WARNING: " in line and "waiting" in line for line in logged), "only the one waiting message"
    # the player and trainer, started with it, wait on: long-running workers never give up on the database
    for worker in (procs["play"], procs["train"]):
        assert worker.alive(), f"{worker.name} gave up:\n{worker.stderr()}"
        assert worker.stderr().count("unreachable") == 1, "the waiting message is said once"


STARVED = """
import os
import sys

sys.path.insert(0, {tests!r})
from fake_experiment import FakeExperiment


class Starved(FakeExperiment):
    def sample(self, db, batch_size):
        return []  # never enough sessions: the trainer waits on its prefetcher


def make_experiment(db):
    print("device", os.environ.get("TINYVERSE_DEVICE"), flush=True)
    return Starved(db)
"""


def test_a_starved_trainer_still_stops_on_sigterm(tmp_path, fleet):
    exp = tmp_path / "starved.py"
    exp.write_text(STARVED.format(tests=str(EXP.parent)))
    db = connect(f"sqlite:///{tmp_path / 'tinyverse.db'}", "starved")
    db.add_sessions([{"x": np.zeros(3)}] * 8, capacity=100)
    trainer = fleet.start(exp, "train", "-b", "4", "--device", "cuda:3")
    fleet.wait(lambda: db.workers(), "the trainer's heartbeat", alive=(trainer,))
    assert trainer.stop(sig=signal.SIGTERM) == 0
    assert "device cuda:3" in trainer.stdout()  # --device reaches the experiment


def test_a_missing_extra_is_named(tmp_path):
    exp = tmp_path / "needs_box2d.py"
    exp.write_text("raise ModuleNotFoundError(\"No module named 'Box2D'\", name='Box2D')\n")
    sqlite_db(tmp_path)
    out = run_cli(exp, "eval", cwd=tmp_path, check=False)
    assert out.returncode == 1 and "pip install 'tinyverse[box2d]'" in out.stderr


# -- counts must be positive -------------------------------------------------------------------------------------------
BAD_COUNTS = {
    "play -b -3": (["play", "-b", "-3"], "-b/--batch-size", "'-3'"),
    "play -b 0": (["play", "-b", "0"], "-b/--batch-size", "'0'"),
    "play -s 0": (["play", "-s", "0"], "-s/--sync-every", "'0'"),
    "play -n 0": (["play", "-n", "0"], "-n/--rounds", "'0'"),
    "train -s 0": (["train", "-s", "0"], "-s/--save-every", "'0'"),
    "train -b -1 -n 3": (["train", "-b", "-1", "-n", "3"], "-b/--batch-size", "'-1'"),
    "train -n 1.5": (["train", "-n", "1.5"], "-n/--updates", "'1.5'"),
    "play --buffer-size 0": (["play", "--buffer-size", "0"], "--buffer-size", "'0'"),
    "eval -n 0": (["eval", "-n", "0"], "-n/--episodes", "'0'"),
    "eval -n -1": (["eval", "-n", "-1"], "-n/--episodes", "'-1'"),
    "run --players 0": (["run", "--players", "0"], "--players", "'0'"),
}


@pytest.mark.parametrize("case", BAD_COUNTS)
def test_counts_must_be_positive(case, tmp_path):
    args, flag, value = BAD_COUNTS[case]
    proc = cli(EXP, *args, cwd=tmp_path, check=False)
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert flag in line and f"at least 1, got {value}" in line, line
    assert not (tmp_path / "tinyverse.db").exists(), "nothing runs on bad arguments"


# -- options through --set -------------------------------------------------------------------------------------------
def test_set_reaches_the_experiment_and_later_workers_adopt_the_stored_options(tmp_path):
    db = sqlite_db(tmp_path)
    cli(EXP, "play", "-b", 2, "-n", 2, cwd=tmp_path, session_length=5, epsilon=0.5)
    assert db.setting("options")["session_length"] == 5 and db.setting("options")["epsilon"] == 0.5
    cli(EXP, "play", "-b", 2, "-n", 1, cwd=tmp_path)  # no --set: the run's options
    batch = db.get_batch([1, 2, 3, 4, 5, 6])
    assert batch["observations"].shape == (6, 6, 4), "every session has 5 ticks"
    cli(EXP, "train", "-b", 2, "-n", 2, cwd=tmp_path)  # the fake's train_step checks the session length
    assert db.load_params()[1]["updates"][0] == 2
    info = cli(EXP, "info", cwd=tmp_path).stdout
    assert "session_length=5" in info and "epsilon=0.5" in info

    conflict = cli(EXP, "train", "-n", 1, cwd=tmp_path, check=False, w_rows=5, session_length=5)  # w_rows: structural
    assert conflict.returncode == 1
    line = one_error_line(conflict)
    assert "w_rows=5" in line and "w_rows=4" in line and "session_length" not in line
    assert db.setting("options")["w_rows"] == 4


OPTION_ERRORS = {
    "unknown name": ({"epsilonn": "0.2"}, ["no option 'epsilonn'", "epsilon"]),
    "bad value": ({"epsilon": "lots"}, ["epsilon='lots'", "not a float"]),
    "bad int": ({"session_length": "8.5"}, ["session_length='8.5'", "not a int"]),
}


@pytest.mark.parametrize("case", OPTION_ERRORS)
def test_bad_options_are_one_line_errors(case, tmp_path):
    options, words = OPTION_ERRORS[case]
    proc = cli(EXP, "play", "-n", 1, cwd=tmp_path, check=False, **options)
    assert proc.returncode == 1
    line = one_error_line(proc)
    for w in words:
        assert w in line, f"{w!r} missing from {line}"
    assert sqlite_db(tmp_path).setting("options") is None and sqlite_db(tmp_path).count_sessions() == (0, 0)


def test_set_on_an_experiment_without_options_is_an_error(tmp_path):
    exp = write(tmp_path / "plain.py", STARVED.format(tests=str(EXP.parent)))
    for bad in (["--set", "epsilon=0.2"], ["--set", "epsilon"]):
        proc = cli(exp, "play", "-n", 1, *bad, cwd=tmp_path, check=False)
        assert proc.returncode == 1
        line = one_error_line(proc)
        assert (
            ("takes no options" in line) if bad[1] == "epsilon=0.2" else ("NAME=VALUE" in line and "'epsilon'" in line)
        )


# -- corrupt and foreign sessions --------------------------------------------------------------------------------------
def test_a_trainer_on_corrupt_sessions_makes_its_updates_and_says_so_once(tmp_path):
    db = sqlite_db(tmp_path)
    cli(EXP, "play", "-b", 2, "-n", 20, cwd=tmp_path)
    with sqlite3.connect(tmp_path / "tinyverse.db") as conn:  # truncate every fourth record
        conn.execute(f'UPDATE "{PREFIX}:sessions" SET data = substr(data, 1, 20) WHERE id % 4 = 0')
    proc = cli(EXP, "train", "-b", 4, "-n", 30, "-s", 1000, cwd=tmp_path, timeout=60)
    assert db.load_params()[1]["updates"][0] == 30, "every update made and published"
    assert 1 <= db.counter("corrupt") <= 10
    # the trainer may also say, once, that it waits for a batch (a hint that names corrupt records): not a warning
    warnings = [line for line in proc.stderr.splitlines() if "WARNING" in line and "corrupt" in line]
    assert len(warnings) == 1, "the corrupt records are reported once, not at every batch:\n" + "\n".join(warnings)
    assert "Traceback" not in proc.stderr


ACROBOT = """
import dataclasses
import sys

import gymnasium as gym
import numpy as np

sys.path.insert(0, {tests!r})
from fake_experiment import Args, FakeExperiment


class Acrobot(FakeExperiment):
    '''Observations of 6 numbers instead of CartPole's 4; the same params.'''

    def make_env(self, render_mode=None):
        return gym.make("Acrobot-v1", render_mode=render_mode)

    def act(self, observations, memory, greedy=False):
        return np.zeros(len(observations), np.int64), {{"steps": memory["steps"] + 1}}


def make_experiment(db, args: Args):
    return Acrobot(db, **dataclasses.asdict(args))
"""


def test_workers_of_another_session_layout_are_refused(tmp_path):
    # The database holds the layout its first players claimed; a player of another layout is refused before it
    # writes. A trainer builds no environment, so it reads no shape: its params' shapes are what it checks.
    db = sqlite_db(tmp_path)
    cli(EXP, "play", "-b", 2, "-n", 2, cwd=tmp_path)
    other = write(tmp_path / "acrobot.py", ACROBOT.format(tests=str(EXP.parent)))
    play = cli(other, "play", "-n", 1, "--prefix", PREFIX, cwd=tmp_path, check=False)
    assert play.returncode == 1
    line = one_error_line(play)
    assert "another layout" in line and "[8, 6]" in line and "[8, 4]" in line
    assert "--prefix" in line and "clear --del-sessions" in line
    assert db.count_sessions() == (4, 4), "nothing of the other layout was stored"
    assert db.params_version() == 1 and db.counter("updates") == 0


# -- which database ----------------------------------------------------------------------------------------------------
PASSWORD = REDIS_PASSWORD


def test_a_wrong_password_is_refused_at_once_and_never_printed(tmp_path, locked_redis):
    for mode in (["info"], [EXP, "play"]):
        proc = cli(*mode, "--password", "sekret", "--port", locked_redis.port, cwd=tmp_path, check=False, timeout=20)
        assert proc.returncode == 1
        line = one_error_line(proc)
        assert "refused the password" in line and f":{locked_redis.port}" in line
        assert "sekret" not in proc.stderr + proc.stdout


def test_host_port_password_and_key_prefix_select_the_server_and_namespace(tmp_path, locked_redis):
    where = ["--host", "127.0.0.1", "--port", locked_redis.port, "--password", PASSWORD]
    empty = cli("clear", "--all", *where, cwd=tmp_path)
    assert empty.stdout.strip() == f"nothing to clear: no experiments in redis://:***@127.0.0.1:{locked_redis.port}/0"
    cli(EXP, "play", "-b", 2, "-n", 2, "--key-prefix", "ns1", *where, cwd=tmp_path)
    db = connect(f"redis://:{PASSWORD}@127.0.0.1:{locked_redis.port}/0", "ns1")
    assert db.count_sessions() == (4, 4)
    assert "ns1" in db.namespaces() and connect(db.url.replace("***", PASSWORD), "tinyverse").count_sessions()[0] == 0
    info = cli("info", *where, cwd=tmp_path).stdout
    assert info.startswith("[ns1] redis://:***@127.0.0.1:") and "4 stored" in info and PASSWORD not in info
    assert not (tmp_path / "tinyverse.db").exists(), "nothing went to the default SQLite file"


def test_info_and_plot_on_a_mistyped_sqlite_path_create_no_file(tmp_path):
    sqlite_db(tmp_path).add_sessions([{"x": np.zeros(2)}], capacity=10)
    for mode in ("info", "plot"):
        proc = cli(EXP, mode, "--db", "sqlite:///tinyvers.db", cwd=tmp_path, check=False)
        assert proc.returncode == 1
        line = one_error_line(proc)
        assert "no SQLite database at tinyvers.db" in line and "--db" in line
        assert not (tmp_path / "tinyvers.db").exists()


def test_info_reads_tinyverse_db_from_the_environment(tmp_path):
    url = f"sqlite:///{tmp_path / 'elsewhere.db'}"
    connect(url, "from_env").add_sessions([{"x": np.zeros(2)}] * 3, capacity=10)
    out = cli("info", cwd=tmp_path, env={"TINYVERSE_DB": url}).stdout
    assert out.startswith(f"[from_env] {url}") and "3 stored" in out
    assert not (tmp_path / "tinyverse.db").exists()


def test_clear_all_of_an_empty_database_says_there_is_nothing_to_clear(tmp_path):
    sqlite_db(tmp_path)  # the file exists, no experiment has data
    out = cli("clear", "--all", cwd=tmp_path)
    assert out.stdout.strip() == "nothing to clear: no experiments in sqlite:///tinyverse.db"


def test_buffer_size_changes_the_stored_capacity_and_says_so(tmp_path):
    db = sqlite_db(tmp_path)
    cli(EXP, "play", "-n", 1, cwd=tmp_path)
    before = db.capacity()
    assert before is not None and before != 500
    proc = cli(EXP, "play", "-n", 1, "--buffer-size", 500, cwd=tmp_path)
    assert db.capacity() == 500
    (said,) = [line for line in proc.stderr.splitlines() if f"buffer size of {PREFIX}" in line]
    assert "500" in said and str(before) in said and "every worker" in said
    again = cli(EXP, "play", "-n", 1, "--buffer-size", 500, cwd=tmp_path)
    assert db.capacity() == 500 and "buffer size" not in again.stderr, "said only when it changes"


# -- the command line's edge: each value checked where it comes in, one line, no secret --------------------------------
SECRET = "hunter2"  # typed on the command lines below: never printed
EDGE = {
    "--db with --port and --password": (["info", "--db", "redis://h:6379/11", "--port", "6380", "--password", SECRET],
                                        ["--db and --port", "--host/--port/--password alone"]),
    "a DB index that is no number": (["info", "--db", "redis://h:6379/1x"], ["DB index '1x'", "whole number"]),
    "port 0 in the URL": (["info", "--db", "redis://h:0/0"], ["port 0", "65535"]),
    "a port past 65535 in the URL": (["info", "--db", "redis://h:99999/0"], ["out of range"]),
    "a port that is no number": (["info", "--db", f"redis://:{SECRET}@h:abc/0"], ["'abc'", ":***@"]),
    "--port 0": (["info", "--port", "0"], ["--port", "at least 1"]),
    "--port past 65535": (["info", "--port", "70000"], ["--port", "at most 65,535"]),
    "--host with a port": (["info", "--host", "h:6380"], ["--host 'h:6380'", "--port"]),
    "an empty --password": (["info", "--password", ""], ["--password is empty"]),
    "a sqlite URL with a query": (["info", "--db", "sqlite:///x.db?mode=ro"], ["no ? or #"]),
    "a sqlite URL of a folder": (["info", "--db", "sqlite:///adir"], ["want a file's path"]),
    "an unknown query item": (["info", "--db", f"redis://h/0?password={SECRET}&x=1"], ["'x'", "password=***"]),
    "a TLS password on redis://": (["info", "--db", f"redis://h/0?ssl_password={SECRET}"], ["'ssl_password'"]),
    "a mistyped --password": (["info", "--pasword", SECRET], ["unrecognized arguments: --pasword ***"]),
    "a mistyped --password=": (["info", f"--pasword={SECRET}"], ["--pasword=***"]),
    "an empty prefix": (["clear", "--del-sessions", "--prefix", ""], ["bad prefix ''"]),
    "a glob prefix *": (["clear", "--del-sessions", "--prefix", "*"], ["bad prefix '*'"]),
    "a glob prefix [": (["clear", "--all", "--prefix", "run[12]"], ["bad prefix 'run[12]'"]),
    "play -b 1e9": ([EXP, "play", "-b", "1000000000"], ["at most 10,000", "start more players"]),
    "run -b 1e9": ([EXP, "run", "-b", "1000000000"], ["at most 10,000"]),
    "train -b past 1e6": ([EXP, "train", "-b", "1000001"], ["-b/--batch-size", "at most 1,000,000"]),
    "run --train-batch past 1e6": ([EXP, "run", "--train-batch", "1000001"], ["--train-batch", "1,000,000"]),
    "--buffer-size past 1e7": ([EXP, "play", "--buffer-size", "10000001"], ["at most 10,000,000"]),
    "run --players 1e6": ([EXP, "run", "--players", "1000000"], ["--players", "at most 1,000"]),
    "a count past 2^63": ([EXP, "play", "-n", "9" * 30], ["-n/--rounds", "at most"]),
    "a negative seed": ([EXP, "play", "--seed", "-1"], ["--seed", "at least 0"]),
    "--target-return nan": ([EXP, "run", "--target-return", "nan"], ["--target-return", "finite"]),
    "info --watch -1": (["info", "--watch", "-1"], ["--watch", "0.1 to 86400"]),
    "info --watch 0": (["info", "--watch", "0"], ["--watch", "0.1 to 86400"]),
    "info --watch nan": (["info", "--watch", "nan"], ["--watch", "finite"]),
    "plot -o of an unknown type": (["plot", "-o", "curve.xyz"], ["curve.xyz", ".png", ".svg"]),
    "plot -o without a type": (["plot", "-o", "curve"], ["plot -o curve:", ".png"]),
    "plot -o into a missing folder": (["plot", "-o", "missing/curve.png"], ["-o/--output", "no folder missing"]),
    "plot -o onto a folder": (["plot", "-o", "adir"], ["-o/--output", "'adir' is a folder"]),
    "export -o onto a folder": ([EXP, "export", "-o", "adir"], ["-o/--output", "'adir' is a folder"]),
    "export -o into a missing folder": ([EXP, "export", "-o", "missing/a.safetensors"], ["no folder missing"]),
}  # fmt: skip


@pytest.mark.parametrize("case", EDGE)
def test_what_the_command_line_reads_is_checked_in_one_line(case, tmp_path, monkeypatch, capsys):
    args, words = EDGE[case]
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TINYVERSE_DB", raising=False)
    (tmp_path / "adir").mkdir()
    assert main([str(a) for a in args]) == 1
    out, err = capsys.readouterr()
    line = one_error_line(err)
    for w in words:
        assert w in line, f"{w!r} missing from: {line}"
    assert SECRET not in out + err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["adir"], "nothing ran: no database, no file"


@pytest.mark.parametrize("mode", [["plot", "-o"], [EXP, "export", "-o"]])
def test_an_output_file_in_a_folder_without_write_permission_is_one_line(mode, tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    try:
        if os.access(locked, os.W_OK):
            pytest.skip("this user (root) writes into any folder: no folder refuses it")
        sqlite_db(tmp_path)
        proc = cli(*mode, locked / "out.png", cwd=tmp_path, check=False)
        assert proc.returncode == 1 and "cannot write" in one_error_line(proc)
    finally:
        locked.chmod(0o755)


def test_secrets_in_a_url_query_or_userinfo_never_show(tmp_path, locked_redis):
    where = f"127.0.0.1:{locked_redis.port}/0"
    cli(EXP, "play", "-b", 1, "-n", 1, "--db", f"redis://{where}?password={PASSWORD}", cwd=tmp_path)
    info = cli("info", "--db", f"redis://{where}?password={PASSWORD}", cwd=tmp_path)
    assert f"[{PREFIX}] redis://{where}?password=***" in info.stdout and PASSWORD not in info.stdout + info.stderr
    for url in (f"redis://{where}?password=wr0ngpw", f"redis://wr0ngpw@{where}", f"redis://:wr0ngpw@{where}"):
        proc = cli("info", "--db", url, cwd=tmp_path, check=False, timeout=20)
        assert proc.returncode == 1 and "wr0ngpw" not in proc.stdout + proc.stderr
        assert "***" in one_error_line(proc)
