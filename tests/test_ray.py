"""``run --ray``: a fleet on a Ray cluster of its own, a head and a worker node on this machine."""

import importlib.util
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
import pytest
from conftest import IN_CI, ROOT, cli_env, free_port, run_cli, wait_for

from tinyverse.database import connect

FAKE = ROOT / "tests" / "fake_experiment.py"
RAY = Path(sys.executable).parent / "ray"


class RayCluster:
    """Nodes started by ``ray start``, each in a session of its own, so that stop() ends exactly their
    processes (``ray stop`` would end every Ray of this user on the machine)."""

    def __init__(self):
        self.port, self.sessions = free_port(), []
        self.temp = tempfile.mkdtemp(prefix="tv-ray-")  # short: Ray's sockets live under it (108-byte limit)
        self.address = f"127.0.0.1:{self.port}"

    def start(self, *args: str) -> None:
        cmd = [str(RAY), "start", "--num-cpus", "1", "--temp-dir", self.temp, "--disable-usage-stats", *args]
        io = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        proc = subprocess.Popen(cmd, start_new_session=True, env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}, **io)
        self.sessions.append(proc.pid)
        out, _ = proc.communicate(timeout=90)
        if proc.returncode != 0:
            raise RuntimeError(f"ray start {' '.join(args)} failed:\n{out}")

    def stop(self) -> None:
        procs = []
        for p in psutil.process_iter():
            try:
                if os.getsid(p.pid) in self.sessions:
                    procs += [p, *p.children(recursive=True)]  # Ray workers and theirs start sessions of their own
            except (OSError, psutil.Error):
                pass
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        psutil.wait_procs(procs, timeout=15)
        shutil.rmtree(self.temp, ignore_errors=True)


@pytest.fixture
def ray_cluster():
    if importlib.util.find_spec("ray") is None or not RAY.exists():
        reason = "Ray is not installed: pip install -e '.[ray]'"
        pytest.fail(f"{reason} (CI=true: the Ray test must run)") if IN_CI else pytest.skip(reason)
    cluster = RayCluster()
    try:
        cluster.start("--head", "--port", str(cluster.port), "--include-dashboard=false")
        cluster.start("--address", cluster.address)
        yield cluster
    finally:
        cluster.stop()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.timeout(150)
def test_run_on_a_ray_cluster_spreads_restarts_and_stops_warmly(ray_cluster, redis_url, prefix, tmp_path):
    (tmp_path / "exp").mkdir()  # the folder Ray ships: the experiment alone
    exp = shutil.copy(FAKE, tmp_path / "exp")
    db_args = ["--db", redis_url, "--prefix", prefix]
    cmd = [sys.executable, "-m", "tinyverse", exp, "run", "--ray", ray_cluster.address, "--eval-episodes", "0"]
    run = subprocess.Popen(
        cmd + db_args, cwd=tmp_path, env=cli_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    db = connect(redis_url, prefix, retry_for=5)

    def fleet():
        assert run.poll() is None, run.communicate()[1]
        return len(w := db.workers()) == 2 and w

    try:
        workers = wait_for(fleet, 90, "a player and a trainer on the cluster")
        wait_for(lambda: db.count_sessions()[1] >= 20 and (db.params_version() or 0) >= 2, 60, "sessions and updates")
        info = run_cli(exp, "info", *db_args).stdout
        nodes = dict(re.findall(r"^  (player|trainer)\s+\S+ pid \d+ on ray node (\w+) ", info, re.M))
        assert nodes.keys() == {"player", "trainer"} and nodes["player"] != nodes["trainer"], info
        for w in workers:  # each runs in the copy of the folder that Ray unpacked on its node
            assert psutil.Process(w["pid"]).cwd().startswith(ray_cluster.temp)

        (player,) = [w for w in workers if w["role"] == "player"]
        os.kill(player["pid"], signal.SIGKILL)
        others = lambda: [w["pid"] for w in db.workers() if w["pid"] != player["pid"]]
        pids = wait_for(lambda: len(others()) == 2 and others(), 60, "a new player")  # run started it again
        (again,) = [w for w in db.workers() if w["pid"] in pids and w["role"] == "player"]
        assert again["place"].startswith("ray node") and not alive(player["pid"])

        run.send_signal(signal.SIGINT)  # Ctrl-C
        out, err = run.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    try:
        assert run.returncode == 0, err
        assert "run stopped: interrupted" in out
        assert "player-0 exited with code -9; restarting" in err
        wait_for(lambda: not any(map(alive, pids)), 30, "the workers to stop")
        assert [w for w in db.workers() if w["pid"] in pids] == []  # they left: a warm stop, not a kill
    finally:
        db.clear(sessions=True, params=True, workers=True, metrics=True)
