"""``run --ray ADDRESS``: the fleet of ``run`` placed on the nodes of a Ray cluster.

Each player or trainer is one Ray task running the very command ``run`` starts
locally (``python -m tinyverse EXP play|train ...``) as a subprocess, in the
experiment's folder that Ray ships to every node (runtime_env ``working_dir``),
so an experiment that imports its neighbours works there too. The driver is
``launcher.run_fleet``, unchanged (progress, stop conditions, restarts with
backoff, warm stop), with a :class:`RayProcess` in place of a ``Popen``; Ray's
own retries stay off. Ray is imported here only: the core runs without it.
"""

import logging
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import TinyverseError, masked
from ..workers import PARENT, PLACE

log = logging.getLogger(__name__)
# shipped with the experiment's folder: never the caches, databases and videos that pile up beside it
EXCLUDES = [".git", ".venv", "__pycache__", "*.db", "*.db-wal", "*.db-shm", "records", "runs"]


def _worker(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """The Ray task: run one worker on this node until it exits; its exit code and last output."""
    import ray

    node = f"ray node {ray.get_runtime_context().get_node_id()[:8]} ({ray.util.get_node_ip_address()})"
    env = {**os.environ, **env, PARENT: str(os.getpid()), PLACE: node}  # it stops if this Ray worker dies
    with tempfile.TemporaryFile() as out:
        io = dict(stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        proc = subprocess.Popen([sys.executable, "-m", "tinyverse", *argv], env=env, start_new_session=True, **io)
        try:
            while True:  # short waits: ray.cancel arrives as a KeyboardInterrupt between them
                try:
                    code = proc.wait(0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
        except KeyboardInterrupt:  # run stops the fleet: a warm stop, the trainer publishes
            proc.terminate()
            code = proc.wait()
        out.seek(0)
        return code, out.read()[-4000:].decode(errors="replace")


class RayProcess:
    """One worker's Ray task, with the part of ``subprocess.Popen`` that ``launcher.Child`` uses."""

    def __init__(self, ray, task, argv: list[str], env: dict[str, str], logfile: Path):
        self.ray, self.logfile, self.returncode = ray, logfile, None
        self.ref = task.remote(argv, env)

    def poll(self) -> int | None:
        if self.returncode is None and self.ray.wait([self.ref], timeout=0)[0]:
            try:
                self.returncode, output = self.ray.get(self.ref)
            except self.ray.exceptions.TaskCancelledError:
                self.returncode, output = 0, "cancelled before it started\n"
            except self.ray.exceptions.RayError as e:  # its Ray worker or its node died
                self.returncode, output = 1, f"{type(e).__name__}: {e}\n"
            with open(self.logfile, "a") as out:  # run shows its tail when it keeps crashing
                out.write(output)
        return self.returncode

    def terminate(self) -> None:
        self.ray.cancel(self.ref)  # a KeyboardInterrupt in the task, which stops its worker warmly

    def kill(self) -> None:
        self.ray.cancel(self.ref, force=True)

    def wait(self, timeout: float | None = None) -> int:
        if not self.ray.wait([self.ref], timeout=timeout)[0]:
            raise subprocess.TimeoutExpired("ray task", timeout)
        return self.poll()


def join(address: str, experiment: str, db_url: str, workers: int):
    """Join the Ray cluster at ``address``, shipping the experiment's folder; return run_fleet's ``spawn``.

    The database must be reachable from every node: a SQLite file or a Redis on
    localhost will do only when every node runs on this machine. Each worker
    takes one of the cluster's CPUs; those beyond wait for one.
    """
    try:
        import ray
    except ImportError:
        raise TinyverseError("run --ray needs Ray: pip install 'tinyverse[ray]'") from None
    shipped = {"working_dir": str(Path(experiment).resolve().parent), "excludes": EXCLUDES}
    try:
        if address != "auto":  # Ray itself retries an address where nothing listens, for minutes
            host, _, port = address.rpartition(":")
            socket.create_connection((host, int(port)), timeout=5).close()
        ray.init(address=address, runtime_env=shipped, log_to_driver=False)
    except (OSError, ValueError) as e:  # ConnectionError included
        why = f"no Ray cluster at --ray {address} ({e})"
        raise TinyverseError(f"{why}: want auto, or the HOST:PORT of a node that ran ray start") from None
    others = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]} - {ray.util.get_node_ip_address()}
    parts = urlsplit(db_url)
    if others and (parts.scheme in ("sqlite", "unix") or parts.hostname in ("localhost", "127.0.0.1", "::1")):
        raise TinyverseError(
            f"--db {masked(db_url)} is reachable from this machine only, but the Ray cluster has nodes on "
            f"{', '.join(sorted(others))}: pass a Redis URL that every node can reach"
        )
    if workers > (cpus := int(ray.cluster_resources().get("CPU", 0))):
        log.warning("%d workers, %d CPUs in the Ray cluster: %d wait for a free CPU", workers, cpus, workers - cpus)
    task = ray.remote(num_cpus=1, max_retries=0, scheduling_strategy="SPREAD")(_worker)

    def spawn(argv: list[str], env: dict[str, str], logfile: Path) -> RayProcess:
        shipped = {k: v for k, v in env.items() if k.startswith("TINYVERSE_") and k != PARENT}
        return RayProcess(ray, task, argv, shipped, logfile)

    return spawn
