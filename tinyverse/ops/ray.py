"""``run --ray ADDRESS``: each worker of ``run`` a Ray task that runs its command in the shipped
experiment folder."""

import functools
import logging
import os
import socket
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit

from ..errors import TinyverseError, install, masked
from ..workers import PARENT, PLACE, spawn

log = logging.getLogger(__name__)
# shipped with the experiment's folder: never the caches, databases and videos piled up beside it
EXCLUDES = [".git", ".venv", "__pycache__", "*.db", "*.db-wal", "*.db-shm", "records", "runs"]


def join(address: str, experiment: str, url: str, workers: int):
    """Join the Ray cluster at ``address``, shipping the experiment's folder; ``run``'s spawn."""
    try:
        import ray
    except ImportError:
        raise TinyverseError(f"run --ray needs Ray: {install('ray')}") from None
    shipped = {"working_dir": str(Path(experiment).resolve().parent), "excludes": EXCLUDES}
    try:
        if address != "auto":  # Ray itself retries an address where nothing listens, for minutes
            host, _, port = address.rpartition(":")
            socket.create_connection((host, int(port)), timeout=5).close()
        ray.init(address=address, runtime_env=shipped, log_to_driver=False)
    except (OSError, ValueError) as e:  # ConnectionError included
        raise TinyverseError(
            f"no Ray cluster at --ray {address} ({e}): want auto, or the HOST:PORT of a node "
            "that ran ray start"
        ) from None
    others = {n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]}
    others -= {ray.util.get_node_ip_address()}
    parts = urlsplit(url)
    here = parts.scheme in ("sqlite", "unix") or parts.hostname in ("localhost", "127.0.0.1", "::1")
    if others and here:
        raise TinyverseError(
            f"--db {masked(url)} is reachable from this machine only, but the Ray cluster has "
            f"nodes on {', '.join(sorted(others))}: pass a Redis URL that every node can reach"
        )
    if workers > (cpus := int(ray.cluster_resources().get("CPU", 0))):
        said = "%d workers, %d CPUs in the Ray cluster: %d wait for a free CPU"
        log.warning(said, workers, cpus, workers - cpus)
    # a CPU each; Ray's retries off
    task = ray.remote(num_cpus=1, max_retries=0, scheduling_strategy="SPREAD")(_worker)
    return functools.partial(RayProcess, ray, task)


def _worker(argv: list[str], env: dict[str, str]) -> tuple[int, str]:
    """The Ray task: run one worker on this node until it exits; its exit code and last output."""
    import ray

    node = ray.get_runtime_context().get_node_id()[:8]
    place = f"ray node {node} ({ray.util.get_node_ip_address()})"
    env = {**os.environ, **env, PARENT: str(os.getpid()), PLACE: place}  # stops if this task dies
    with tempfile.TemporaryDirectory() as folder:
        proc = spawn(argv, env, log := Path(folder) / "worker.log")
        try:
            while (code := proc.poll()) is None:  # short sleeps: ray.cancel comes as Ctrl-C
                time.sleep(0.5)
        except KeyboardInterrupt:  # run stops the fleet: a warm stop, the trainer publishes
            proc.terminate()
            code = proc.wait()
        return code, log.read_text(errors="replace")[-4000:]


class RayProcess:
    """One worker's Ray task, with the part of ``subprocess.Popen`` that ``run`` uses: poll,
    terminate, kill."""

    def __init__(self, ray, task, argv: list[str], env: dict[str, str], logfile: Path):
        self.ray = ray
        self.logfile = logfile
        self.returncode = None
        self.ref = task.remote(argv, {k: v for k, v in env.items() if k.startswith("TINYVERSE_")})

    def poll(self) -> int | None:
        if self.returncode is None and self.ray.wait([self.ref], timeout=0)[0]:
            try:
                self.returncode, output = self.ray.get(self.ref)
            except self.ray.exceptions.RayError as e:  # cancelled, or its Ray worker or node died
                self.returncode = 1
                output = f"{type(e).__name__}: {e}\n"
            with open(self.logfile, "a") as out:  # run shows its tail when it keeps crashing
                out.write(output)
        return self.returncode

    def terminate(self) -> None:
        self.ray.cancel(self.ref)  # a KeyboardInterrupt in the task, which stops its worker warmly

    def kill(self) -> None:
        self.ray.cancel(self.ref, force=True)
