"""Three machines on one: network namespaces joined by veth links, a real multi-host fleet.

    sudo python deploy/netns.py                 # Redis, a trainer host, a player host; 60 s each way
    sudo python deploy/netns.py --seconds 30 --players 2 --experiment examples/cartpole_dqn.py

The script builds three network namespaces: ``db`` holds a bridge and Redis (with a password) on
10.231.0.1; ``trainer`` (10.231.0.2) and ``players`` (10.231.0.3) hang off that bridge by veth
links. Every worker runs under its own hostname (``unshare --uts``), so tinyverse sees three
machines: ``info`` lists workers per host, and ``clear --kill-players`` from the trainer's host
*asks* the remote players to stop through the database. Nothing outside the namespaces is touched
and only their addresses are used. It then runs the same fleet on this host's loopback and prints
the env steps/s of both. Run as root (``ip netns`` needs it); ``tests/test_multihost.py`` drives the
same pieces and checks each step.

On real machines the lines are the ones this script runs in each namespace:
``TINYVERSE_DB=redis://:PASSWORD@DB-HOST:6379/0 python -m tinyverse EXP.py train`` (or ``play``).
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUBNET = "10.231.0"
ADDRESS = {"db": f"{SUBNET}.1", "trainer": f"{SUBNET}.2", "players": f"{SUBNET}.3"}
PASSWORD = "netns-" + uuid.uuid4().hex[:12]
LAN_URL = f"redis://:{PASSWORD}@{ADDRESS['db']}:6379/0"


def sh(*args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(args, check=check, capture_output=True, text=True, env={**os.environ, **(env or {})})


class Hosts:
    """The three namespaces, named ``tv<tag>-<role>``; ``close()`` removes every trace."""

    def __init__(self):
        self.tag = uuid.uuid4().hex[:6]
        self.ns = {role: f"tv{self.tag}-{role}" for role in ADDRESS}
        self.procs: list[subprocess.Popen] = []

    def build(self) -> "Hosts":
        for name in self.ns.values():
            sh("ip", "netns", "add", name)
        db = self.ns["db"]
        self.run_in("db", "ip", "link", "add", "br0", "type", "bridge")
        self.run_in("db", "ip", "addr", "add", f"{ADDRESS['db']}/24", "dev", "br0")
        for role in ("trainer", "players"):  # a veth pair: one end in the host, one on the bridge
            inside, peer = f"v{self.tag}{role[0]}", f"p{self.tag}{role[0]}"
            sh("ip", "link", "add", inside, "netns", self.ns[role], "type", "veth", "peer", "name", peer, "netns", db)
            self.run_in("db", "ip", "link", "set", peer, "master", "br0", "up")
            self.run_in(role, "ip", "addr", "add", f"{ADDRESS[role]}/24", "dev", inside)
            self.run_in(role, "ip", "link", "set", inside, "up")
        for role in self.ns:
            self.run_in(role, "ip", "link", "set", "lo", "up")
        self.run_in("db", "ip", "link", "set", "br0", "up")
        return self

    def run_in(self, role: str, *args: str, check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
        return sh("ip", "netns", "exec", self.ns[role], *args, check=check, env=env)

    def python(self, role: str, code: str) -> str:
        """Run Python ``code`` in namespace ``role`` (this project importable); its output."""
        return self.run_in(role, sys.executable, "-c", f"import sys; sys.path.insert(0, {str(ROOT)!r})\n{code}").stdout

    def start(self, role: str, hostname: str, argv: list[str], log: Path, env: dict | None = None):
        """``argv`` in namespace ``role`` under ``hostname``, its output in ``log``."""
        wrapped = ["ip", "netns", "exec", self.ns[role], "unshare", "--uts", "sh", "-c",
                   'hostname "$0" && exec "$@"', hostname, *argv]  # fmt: skip
        with open(log, "ab") as out:
            proc = subprocess.Popen(wrapped, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        self.procs.append(proc)
        return proc

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for name in self.ns.values():
            sh("ip", "netns", "del", name, check=False)  # its veth ends and the bridge go with it


def redis_argv(workdir: Path, port: int = 6379) -> list[str]:
    """Redis for the LAN: bound to the bridge, a password, an append-only file to survive a restart."""
    return ["redis-server", "--bind", ADDRESS["db"], "--port", str(port), "--requirepass", PASSWORD,
            "--save", "", "--appendonly", "yes", "--dir", str(workdir)]  # fmt: skip


def wait_redis(url: str, timeout: float = 15.0) -> None:
    import redis

    deadline = time.monotonic() + timeout
    while True:
        try:
            redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
            return
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def tinyverse(experiment: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "tinyverse", experiment, *args]


def fleet_rate(
    experiment: str, players: int, seconds: float, hosts: Hosts | None, workdir: Path, warmup: float = 8.0
) -> float:
    """Env steps/s of one trainer and ``players`` players over ``seconds``, on the namespaces or on loopback."""
    from tinyverse.database import connect

    prefix = f"rate{uuid.uuid4().hex[:6]}"
    if hosts is None:  # this host: a Redis of our own on loopback
        port = 26000 + os.getpid() % 1000
        argv = ["redis-server", "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no"]
        server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        wait_redis(url)
        env = {**os.environ, "TINYVERSE_DB": url}
        procs = [subprocess.Popen(tinyverse(experiment, "train", "-q", "--prefix", prefix), env=env)]
        procs += [subprocess.Popen(tinyverse(experiment, "play", "-q", "--prefix", prefix), env=env)
                  for _ in range(players)]  # fmt: skip
        db = connect(url, prefix, retry_for=10)

        def added():
            return db.count_sessions()[1]
    else:
        url, server = LAN_URL, None
        env = {"TINYVERSE_DB": url}
        procs = [hosts.start("trainer", "trainer-host", tinyverse(experiment, "train", "-q", "--prefix", prefix),
                             workdir / "trainer.log", env)]  # fmt: skip
        procs += [hosts.start("players", f"player-host-{i}", tinyverse(experiment, "play", "-q", "--prefix", prefix),
                              workdir / f"player-{i}.log", env) for i in range(players)]  # fmt: skip

        def added():  # read from the trainer's host: this namespace has no route to the bridge
            code = f"from tinyverse.database import connect; print(connect({url!r}, {prefix!r}).count_sessions()[1])"
            return int(hosts.python("trainer", code))

    try:
        time.sleep(warmup)  # start-up (imports) is not the rate
        first, t0 = added(), time.monotonic()
        time.sleep(seconds)
        last, t1 = added(), time.monotonic()
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        if server is not None:
            server.kill()
            server.wait()
    from tinyverse.loader import load_experiment

    T = load_experiment(experiment).run.settings.session_length
    return (last - first) * T / (t1 - t0)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experiment", default=str(ROOT / "examples" / "cartpole_dqn.py"))
    p.add_argument("--players", type=int, default=2, help="player processes on the player host")
    p.add_argument("--seconds", type=float, default=60.0, help="how long each fleet is measured")
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run as root: ip netns needs it")
    with tempfile.TemporaryDirectory() as tmp:
        hosts = Hosts().build()
        try:
            hosts.start("db", "db-host", redis_argv(Path(tmp)), Path(tmp) / "redis.log")
            hosts.python("trainer", f"from deploy.netns import wait_redis; wait_redis({LAN_URL!r})")
            spread = fleet_rate(args.experiment, args.players, args.seconds, hosts, Path(tmp))
        finally:
            hosts.close()
        local = fleet_rate(args.experiment, args.players, args.seconds, None, Path(tmp))
    print(f"{Path(args.experiment).name}, 1 trainer + {args.players} players, {args.seconds:g} s each:")
    print(f"  3 hosts (network namespaces, Redis over veth): {spread:,.0f} env steps/s")
    print(f"  1 host (Redis on loopback):                     {local:,.0f} env steps/s")
    print(f"  ratio 3 hosts / 1 host: {spread / local:.2f}")


if __name__ == "__main__":
    main()
