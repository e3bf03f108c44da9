"""Documented flags that no other test checks, each through the real CLI, each held to what docs/cli.rst,
docs/usage.rst or its --help says it does: run --target-eval, -b and --buffer-size; --sync/--no-sync of train and
run; info --watch and --last; clear --del-params (--del-weights); --version; -v, -vv and -q."""

import re
import signal
import time

import psutil
import pytest
from conftest import ROOT, run_cli, sets, spawn, wait_for
from fake_experiment import FakeExperiment

import tinyverse
from tinyverse.database import connect

FAKE = ROOT / "tests" / "fake_experiment.py"
PREFIX = "fake_experiment"  # the default prefix: the experiment's name
CLEAR_SCREEN = "\033[H\033[J"  # what info --watch prints before each draw


def sqlite(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'flags.db'}"


def workers(db, role: str) -> list[dict]:
    return [w for w in db.workers() if w["role"] == role]


# -- run ---------------------------------------------------------------------------------------------------------------
def test_run_target_eval_holds_the_target_against_greedy_episodes_not_the_training_returns(tmp_path):
    # every episode is cut at 5 steps: the training returns reach 5 at once, yet run waits for two greedy evals in a
    # row (the default --target-passes with --target-eval), 30 s apart, to stop; the trainer publishes on (each 100
    # updates, and as it stops) after that eval, yet the final eval plays the very params that eval judged, kept as
    # the snapshot passed (it played the newest ones, another version, before)
    url = sqlite(tmp_path)
    args = ["--target-return", "5", "--target-eval", "3", "--eval-episodes", "3", "--set", "max_steps=5"]
    started = time.monotonic()
    out = run_cli(FAKE, "run", *args, "--db", url, cwd=tmp_path, timeout=180)
    assert time.monotonic() - started >= 60, f"it stopped before its second greedy eval:\n{out.stdout}"
    judged = re.search(r"run stopped: greedy eval's mean return 5.00 ± 0 over 3 episodes of params v(\d+) reached "
                       r"the target 5 \(2 evals in a row\); kept as snapshot passed\n", out.stdout)  # fmt: skip
    assert judged, out.stdout
    version = int(judged[1])
    assert f"greedy eval of params v{version}: mean return 5.00 ± 0 over 3 episodes (target 5)" in out.stderr
    assert f"mean return 5.00 ± 0 over 3 episodes (params v{version})\n" in out.stdout, "the final eval's"
    said = f"verdict on params v{version} (snapshot passed): 5.00 ± 0 over 3 episodes in the greedy eval; 5.00 ± 0"
    assert f"{said} over 3 episodes in the final eval" in out.stdout
    db = connect(url, PREFIX)
    assert db.find_params("passed")[0] == version and db.snapshots()[0][:2] == ("passed", version)
    assert db.params_version() > version, "the trainer published after the verdict: the final eval had a choice"
    returns = [m["return"] for m in db.metrics("episodes")]
    assert len(returns) >= 20 and set(returns) == {5.0}, "the training returns alone would have stopped it"


def test_run_b_sets_its_players_environments_and_buffer_size_the_database_s(tmp_path):
    url = sqlite(tmp_path)
    run_cli(FAKE, "play", "-n", "1", "--buffer-size", "40", "--db", url, cwd=tmp_path)  # 2 sessions; a size stored
    run = spawn(FAKE, "run", "-b", "3", "--buffer-size", "12", "--eval-episodes", "0", "--db", url, cwd=tmp_path)
    db = connect(url, PREFIX, retry_for=5)
    (player,) = wait_for(lambda: run.running() and workers(db, "player"), 60, "run's player")
    argv = psutil.Process(player["pid"]).cmdline()
    assert argv[argv.index("play") :][:3] == ["play", "-b", "3"], argv
    wait_for(lambda: run.running() and db.count_sessions().added >= 40, 60, "40 sessions")
    assert run.stop(sig=signal.SIGINT) == 0, run.stderr()
    # every worker keeps 12 sessions at most, and the change of a stored size is said
    assert db.capacity() == 12 and db.count_sessions().stored == 12
    assert "buffer size of fake_experiment: 12 sessions, was 40 (for every worker)" in run.stderr()
    assert (db.count_sessions().added - 2) % 3 == 0, "the player's rounds add 3 sessions each"


@pytest.mark.parametrize("flag", ["--sync", "--no-sync", None])
def test_run_hands_sync_or_no_sync_to_its_trainers(tmp_path, flag):
    url = sqlite(tmp_path)
    given = [flag] if flag else []
    run = spawn(FAKE, "run", "--trainers", "2", *given, "--eval-episodes", "0", "--db", url, cwd=tmp_path)
    db = connect(url, PREFIX, retry_for=5)
    trainers = wait_for(lambda: run.running() and len(ts := workers(db, "trainer")) == 2 and ts, 60, "two trainers")
    for w in trainers:
        argv = psutil.Process(w["pid"]).cmdline()
        assert [a for a in argv if a in ("--sync", "--no-sync")] == given, argv
    assert run.stop(sig=signal.SIGINT) == 0, run.stderr()


# -- train -------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("sync", [True, False], ids=["sync", "no-sync"])
def test_train_sync_takes_the_merged_params_and_no_sync_keeps_its_own(tmp_path, sync):
    # FakeExperiment's params count its updates ("counter" in its metrics); each trainer's reports count its own
    url = sqlite(tmp_path)
    flag = "--sync" if sync else "--no-sync"
    argv = ["train", "-n", "400", "-s", "10", flag, *sets(learning_starts=64, train_sleep=0.005), "--db", url]
    trainers = [spawn(FAKE, *argv, cwd=tmp_path, name=f"train-{i}") for i in range(2)]
    db = connect(url, PREFIX, retry_for=5)
    # both have loaded the stored params (none: a counter of 0) before a player brings sessions to train on
    wait_for(lambda: all(t.running() for t in trainers) and len(workers(db, "trainer")) == 2, 60, "two trainers")
    spawn(FAKE, "play", "--db", url, cwd=tmp_path)
    for t in trainers:
        assert t.p.wait(timeout=120) == 0, t.stderr()
    last = {m["worker"]: m for m in db.metrics("train")}  # each trainer's final report, at its 400th update
    assert len(last) == 2 and all(m["updates"] == 400 for m in last.values()), last
    assert db.counter("updates") == 800 == int(db.load_params()[1]["updates"][0]), "both trainers' updates landed"
    for m in last.values():
        if sync:  # its params took in the other trainer's pushes too
            assert m["counter"] > m["updates"], m
        else:  # its params hold its own updates alone
            assert m["counter"] <= m["updates"], m


# -- info --------------------------------------------------------------------------------------------------------------
def test_info_watch_redraws_with_fresh_data_until_ctrl_c(tmp_path):
    url = sqlite(tmp_path)
    db = connect(url, PREFIX)
    db.save_params(FakeExperiment().get_params())
    info = spawn(FAKE, "info", "--watch", "0.2", "--db", url, cwd=tmp_path, name="info")

    def draws() -> list[str]:
        return info.stdout().split(CLEAR_SCREEN)[1:]

    first = wait_for(lambda: info.running() and len(draws()) >= 2 and draws(), 30, "two draws of info --watch")
    assert all("params    version 1," in d and "(every 0.2s; Ctrl-C to quit)" in d for d in first), first
    db.save_params(FakeExperiment().get_params())
    wait_for(lambda: info.running() and "params    version 2," in draws()[-1], 30, "a draw of the new params")
    assert info.stop(sig=signal.SIGINT) == 130 and "tinyverse: interrupted" in info.stderr()


def test_info_last_sums_up_that_many_recent_returns(tmp_path):
    url = sqlite(tmp_path)
    db = connect(url, PREFIX)
    db.save_params(FakeExperiment().get_params())
    db.add_metrics("episodes", [{"return": float(r), "time": time.time(), "steps": 8 * r} for r in range(1, 11)])
    assert (
        "returns   last 3: mean 9.00 ± 0.816, min 8.00, max 10.0"
        in run_cli(FAKE, "info", "--last", 3, "--db", url).stdout
    )
    assert "returns   last 10: mean 5.50 ± 2.87, min 1.00, max 10.0" in run_cli(FAKE, "info", "--db", url).stdout


# -- clear -------------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--del-params", "--del-weights"])
def test_clear_del_params_deletes_the_params_and_nothing_else(tmp_path, flag):
    url = sqlite(tmp_path)
    run_cli(FAKE, "play", "-n", "2", "--db", url, cwd=tmp_path)  # sessions, and the player's params
    db = connect(url, PREFIX)
    db.add_metrics("episodes", [{"return": 3.0, "time": time.time(), "steps": 8}])
    sessions = db.count_sessions()
    returns = db.recent_returns()
    assert db.params_version() == 1 and returns[-1] == 3.0
    out = run_cli(FAKE, "clear", flag, "--db", url, cwd=tmp_path)
    assert out.stdout.strip() == "fake_experiment: cleared params"
    assert db.params_version() is None and db.load_params() is None
    assert db.count_sessions() == sessions and db.recent_returns() == returns


# -- the whole CLI -----------------------------------------------------------------------------------------------------
def test_version_prints_the_package_version(tmp_path):
    out = run_cli("--version", cwd=tmp_path)
    assert out.stdout == f"tinyverse {tinyverse.__version__}\n" and out.stderr == ""


BROKEN = """
def make_experiment(db):
    raise ValueError("no environment here")
"""


def test_quiet_default_verbose_and_debug_log_levels(tmp_path):
    url = sqlite(tmp_path)

    def play(*flags):
        return run_cli(FAKE, "play", "-n", "1", *flags, "--db", url, cwd=tmp_path).stderr

    assert "tinyverse.params INFO: no params stored" in play("--buffer-size", "40")  # the default level: INFO
    assert "tinyverse.player INFO: 16 env steps" in play("-v")
    quiet = play("-q", "--buffer-size", "50")
    assert " INFO: " not in quiet, quiet
    assert "WARNING: buffer size of fake_experiment: 50 sessions, was 40" in quiet, "-q still shows warnings"
    # -vv adds DEBUG: where an experiment failed, which the one-line error leaves out
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN)
    for flags, debug in [((), False), (("-v",), False), (("-vv",), True)]:
        err = run_cli(broken, "play", *flags, "--db", url, cwd=tmp_path, check=False).stderr
        assert err.strip().splitlines()[-1].endswith("ValueError: no environment here (-vv shows where)"), err
        assert ("DEBUG: make_experiment of" in err) is debug and ("Traceback" in err) is debug, (flags, err)
        assert ('raise ValueError("no environment here")' in err) is debug, (flags, err)
