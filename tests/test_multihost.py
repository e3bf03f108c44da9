"""Three hosts on one machine (network namespaces): a real fleet across a LAN, through deploy/netns.py."""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from conftest import ROOT, _missing, wait_for

FAKE = str(ROOT / "tests" / "fake_experiment.py")
_spec = importlib.util.spec_from_file_location("netns", ROOT / "deploy" / "netns.py")
netns = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(netns)
ENV = {"TINYVERSE_DB": netns.LAN_URL, "SDL_VIDEODRIVER": "dummy"}


@pytest.fixture
def hosts():
    """Skipped with the reason on a developer machine that cannot build them; a failure in CI, which must."""
    if shutil.which("redis-server") is None:
        _missing("redis-server is not installed: apt-get install redis-server")
    if shutil.which("ip") is None:
        _missing("the ip command is not installed (network namespaces): apt-get install iproute2")
    if os.geteuid() != 0:
        _missing("network namespaces need root (ip netns add): run the tests as root")
    made = netns.Hosts()
    try:
        made.build()
    except subprocess.CalledProcessError as e:  # the kernel or the sandbox forbids namespaces
        made.close()  # what was built before the refusal goes
        _missing(f"cannot build network namespaces here: {(e.stderr or '').strip()}")
    yield made
    made.close()


def test_a_fleet_across_three_hosts_trains_survives_a_redis_restart_and_stops_remotely(hosts, tmp_path):
    redis_server = hosts.start("db", "db-host", netns.redis_argv(tmp_path), tmp_path / "redis.log")
    hosts.python("trainer", f"from deploy.netns import wait_redis; wait_redis({netns.LAN_URL!r})")
    sets = ["--set", "updates_per_step=0.5", "--set", "pace_slack=64"]
    trainer = hosts.start("trainer", "trainer-host", netns.tinyverse(FAKE, "train", "-b", "4", "-s", "5", *sets),
                          tmp_path / "trainer.log", ENV)  # fmt: skip
    players = [hosts.start("players", "player-host", netns.tinyverse(FAKE, "play", *sets), tmp_path / f"p{i}.log", ENV)
               for i in range(2)]  # fmt: skip

    def progress() -> tuple[int, int]:  # sessions ever added and params version, read from the trainer's host
        code = (f"from tinyverse.database import connect; db = connect({netns.LAN_URL!r}, 'fake_experiment'); "
                "print(db.count_sessions()[1], db.params_version() or 0)")  # fmt: skip
        added, version = hosts.python("trainer", code).split()
        return int(added), int(version)

    first = wait_for(
        lambda: (p := progress())[0] >= 40 and p[1] >= 3 and p, 60, "training progress across hosts", interval=0.3
    )
    info = hosts.run_in("trainer", *netns.tinyverse(FAKE, "info"), check=False, env=ENV).stdout
    hosts_seen = set(re.findall(r"^  (player|trainer)\s+(\S+) pid", info, re.M))
    assert hosts_seen == {("trainer", "trainer-host"), ("player", "player-host")}, info
    assert info.count("player    player-host") == 2 and netns.PASSWORD not in info

    # Redis restarts (its append-only file keeps the data): every worker waits it out and goes on
    redis_server.kill()
    redis_server.wait()
    time.sleep(3)
    hosts.start("db", "db-host", netns.redis_argv(tmp_path), tmp_path / "redis.log")
    wait_for(
        lambda: (p := progress())[0] > first[0] + 40 and p[1] > first[1], 90, "progress after the restart", interval=0.3
    )
    assert all(p.poll() is None for p in [trainer, *players]), "a worker died with the restart"

    # from the trainer's host, clear --kill-players asks the players on the other host to stop
    argv = ["unshare", "--uts", "sh", "-c", 'hostname trainer-host && exec "$@"', "sh"]
    cleared = hosts.run_in("trainer", *argv, *netns.tinyverse(FAKE, "clear", "--kill-players"), check=False, env=ENV)
    assert cleared.stdout.count("on player-host to stop") == 2, cleared.stdout + cleared.stderr
    for p in players:
        assert p.wait(30) == 0, "a remote player did not stop cleanly"
    assert trainer.poll() is None, "the trainer was stopped too"
    trainer.terminate()
    assert trainer.wait(30) == 0
    log = (tmp_path / "p0.log").read_text()
    assert "unreachable" in log and "is back" in log, log  # it said it waited for the restarted server


def test_the_same_fleet_runs_on_three_hosts_and_on_one(hosts, tmp_path):
    # the script's own comparison, short: both fleets play (rates are for the note, not asserted)
    hosts.start("db", "db-host", netns.redis_argv(tmp_path), tmp_path / "redis.log")
    hosts.python("trainer", f"from deploy.netns import wait_redis; wait_redis({netns.LAN_URL!r})")
    spread = netns.fleet_rate(FAKE, 1, 2.0, hosts, tmp_path, warmup=3.0)
    local = netns.fleet_rate(FAKE, 1, 2.0, None, tmp_path, warmup=3.0)
    assert spread > 0 and local > 0
    # the spread fleet ran this interpreter in the trainer's and the players' namespaces, and each stopped warmly
    ran = {p.args[3]: p.returncode for p in hosts.procs if sys.executable in p.args}
    assert ran == {hosts.ns["trainer"]: 0, hosts.ns["players"]: 0}, ran
