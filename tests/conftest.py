"""Shared fixtures: every backend, the shared Redis, and private redis-servers to kill."""

import importlib
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis

from tinyverse.database import connect

ROOT = Path(__file__).resolve().parent.parent
REDIS_URL = os.environ.get("TINYVERSE_TEST_REDIS", "redis://127.0.0.1:6379/15")
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")  # CI=true, CI=1, CI=yes ...


def _missing(reason: str):
    """Skip on a developer machine, fail in CI: CI must run the Redis tests."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the Redis tests must run)")
    pytest.skip(reason)


def optional(module: str):
    """Import an optional package for a test module: skipped with a reason on a developer machine
    that lacks it, an import error in CI (CI installs every extra, so a missing one is a bug there)."""
    if IN_CI:
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"{module} is not installed (pip install -e '.[test]')")


@pytest.fixture(scope="session")
def redis_url() -> str:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as e:
        _missing(f"Redis not reachable at {REDIS_URL} ({e}): start redis-server")
    return REDIS_URL


@pytest.fixture(params=["sqlite", "redis"])
def db_url(request, tmp_path) -> str:
    """A URL for each backend; the conformance suite runs once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    return request.getfixturevalue("redis_url")


@pytest.fixture
def prefix() -> str:
    """A namespace of its own for each test, so tests never see each other's data."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def db(db_url, prefix):
    database = connect(db_url, prefix, retry_for=5)
    yield database
    database.clear(sessions=True, params=True, workers=True, metrics=True)
    database.close()


def wait_for(condition, timeout=60.0, what="condition"):
    """The first truthy value of ``condition()``, polled every 0.1 s; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RedisServer:
    """A private redis-server on a free port, to stop and restart by PID."""

    def __init__(self, tmp_path: Path):
        self.port, self.dir, self.proc = free_port(), tmp_path, None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self):
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(cmd, cwd=self.dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=0.5)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


@pytest.fixture
def redis_server(tmp_path):
    if shutil.which("redis-server") is None:
        _missing("redis-server is not installed: apt-get install redis-server")
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


def run_cli(*args, cwd=None, timeout=120, env=None, check=True) -> subprocess.CompletedProcess:
    """Run ``python -m tinyverse ARGS`` as a real subprocess."""
    proc = subprocess.run(
        [sys.executable, "-m", "tinyverse", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy", **(env or {})},
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"tinyverse {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc
