"""``run``'s supervision through real processes: who is restarted, who outlives run, what it leaves behind; how
its verdict reads."""

import logging
import os
import signal
import subprocess
import sys
import time

import numpy as np
import psutil
from conftest import ROOT, cli_env, wait_for
from test_evaluation import Lander

from tinyverse.database import connect
from tinyverse.evaluation import evaluate
from tinyverse.ops.launcher import Watch

FAKE = ROOT / "tests" / "fake_experiment.py"


def start_run(tmp_path, url, *extra):
    env = cli_env(TMPDIR=tmp_path / "tmp")
    (tmp_path / "tmp").mkdir(exist_ok=True)
    cmd = [sys.executable, "-m", "tinyverse", str(FAKE), "run", "--eval-episodes", "0", "--db", url, *extra]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_workers_stopped_on_purpose_are_not_restarted(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    run = start_run(tmp_path, url)
    db = connect(url, "fake_experiment")
    try:
        wait_for(lambda: len(db.workers()) == 2, 60, "a player and a trainer")
        clear = [sys.executable, "-m", "tinyverse", str(FAKE), "clear", "--kill-players", "--kill-trainers"]
        subprocess.run([*clear, "--db", url], cwd=tmp_path, check=True, capture_output=True, timeout=60)
        out, err = run.communicate(timeout=60)
    finally:
        run.kill()
    assert run.returncode == 0, err
    assert "run stopped: every worker exited by itself" in out
    assert "restarting" not in err and "exited by itself (code 0): not restarted" in err
    assert list((tmp_path / "tmp").iterdir()) == []  # its log folder is gone


def test_workers_stop_when_run_is_killed(tmp_path):
    url = f"sqlite:///{tmp_path / 'run.db'}"
    run = start_run(tmp_path, url, "--players", "2")
    db = connect(url, "fake_experiment")
    try:
        wait_for(lambda: len(db.workers()) == 3, 60, "two players and a trainer")
        pids = [w["pid"] for w in db.workers()]
        assert all(psutil.Process(p).ppid() == run.pid for p in pids)
        assert all(os.getsid(p) == p for p in pids)  # a session of their own: a terminal's Ctrl-C reaches run only
        run.send_signal(signal.SIGKILL)
        run.wait(timeout=10)
        wait_for(lambda: not any(alive(p) for p in pids), 30, "the orphaned workers to stop")
    finally:
        run.kill()
        for w in db.workers():
            if alive(w["pid"]):
                os.kill(w["pid"], signal.SIGKILL)
    assert db.workers() == []  # they left cleanly: a warm stop, not a crash
    assert db.load_params()[1]["updates"][0] > 0  # the trainer published on its way out


def episodes(returns: list[float]) -> list[dict]:
    return [{"return": r, "time": time.time(), "steps": 8 * (i + 1)} for i, r in enumerate(returns)]


def test_a_target_on_training_returns_is_judged_on_a_mean_with_its_spread_and_count(tmp_path):
    db = connect(f"sqlite:///{tmp_path / 'watch.db'}", "watch")
    db.save_params({"w": np.zeros(2)})
    db.add_metrics("episodes", [{"return": 5.0, "time": time.time() - 60, "steps": 8}])  # an earlier run's
    watch = Watch(db, 8, None, target=0.9)
    db.add_metrics("episodes", episodes([0.958, 0.86] * 9 + [0.958]))
    assert watch.check() is None, "19 episodes of this run: not yet judged"
    db.add_metrics("episodes", episodes([0.86]))
    # one decimal said "0.9 reached the target 0.9"
    reason = "recent mean return 0.909 ± 0.0490 over 20 episodes reached the target 0.9 in training (params unknown"
    assert watch.check() == f"{reason}, exploring); kept the latest params, v1, as snapshot passed"
    assert watch.reached


def test_a_target_on_greedy_episodes_names_their_mean_spread_and_count(tmp_path, caplog):
    db = connect(f"sqlite:///{tmp_path / 'watch.db'}", "watch")
    lander = Lander(db)
    db.save_params(lander.get_params())

    def judge():  # as run's --target-eval 2 does: returns 0.958 and 0.192
        version, params = db.load_params()
        return version, params, evaluate(lander, None, 2, quiet=True)

    watch = Watch(db, 8, None, target=0.5, judge=judge)
    assert watch.check() is None, "the first greedy eval comes 30 s into the run"
    watch.judged -= 30  # as if those 30 s had passed
    with caplog.at_level(logging.INFO, logger="tinyverse"):
        reason = watch.check()
    said = "greedy eval's mean return 0.575 ± 0.383 over 2 episodes of params v1 reached the target 0.5"
    assert reason == f"{said}; kept as snapshot passed"
    assert "greedy eval of params v1: mean return 0.575 ± 0.383 over 2 episodes (target 0.5)" in caplog.text
