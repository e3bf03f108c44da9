"""``run``'s supervision through real processes: who is restarted, who outlives run, what it leaves behind."""

import os
import signal
import subprocess
import sys

import psutil
from conftest import ROOT, cli_env, wait_for

from tinyverse.database import connect

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
