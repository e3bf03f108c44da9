"""Shared fixtures and helpers: every backend, a redis-server of the suite's own, private redis-servers to kill,
one polling helper, one process helper, one thread helper for the loops. The suite touches only data it made and
leaves nothing behind."""

import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
import redis

from tinyverse.database import connect

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false", "no")  # CI=true, CI=1, CI=yes ...
REDIS_PASSWORD = "secret"  # the password of the locked_redis server
NAMESPACES = "tinyverse:namespaces"  # the Redis set that lists the prefixes holding data
# every process the suite starts inherits this: .ci/leftovers finds the suite's processes by it
os.environ["TV_TEST_SUITE"] = str(ROOT)
# workers keep their identity tokens under $XDG_CACHE_HOME (tinyverse/identity.py): the suite's go to a folder of its
# own, removed at the end, never into the user's ~/.cache
CACHE = tempfile.mkdtemp(prefix="tinyverse-cache-")
os.environ["XDG_CACHE_HOME"] = CACHE

_skipped_redis: list[str] = []  # why the Redis half was skipped (one summary line at the end)


def _missing(reason: str):
    """Skip on a developer machine, fail in CI: CI must run every test."""
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: this test must run)")
    pytest.skip(reason)


_missing_in_ci: dict[Path, str] = {}  # test modules whose optional package is missing in CI: why


def optional(module: str):
    """Import an optional package for a test module: skipped with a reason on a developer machine
    that lacks it, a failed test in CI (CI installs every extra, so a missing one is a bug there).
    Collection never stops on it: the other modules still run."""
    reason = f"{module} is not installed (pip install -e '.[test]')"
    if not IN_CI:
        return pytest.importorskip(module, reason=reason)
    try:
        return importlib.import_module(module)
    except ImportError:
        caller = sys._getframe(1).f_globals.get("__file__")
        if caller is not None:
            _missing_in_ci[Path(caller).resolve()] = f"{reason} (CI=true: this test must run)"
        raise


class _MissingPackage(pytest.Item):
    """What a test module that cannot import its optional package in CI collects instead: one failure."""

    def runtest(self):
        pytest.fail(_missing_in_ci[self.path], pytrace=False)

    def reportinfo(self):
        return self.path, None, self.name


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    report = yield
    why = _missing_in_ci.get(Path(collector.path).resolve()) if isinstance(collector, pytest.Module) else None
    if report.failed and why is not None:
        item = _MissingPackage.from_parent(collector, name="optional-package")
        return pytest.CollectReport(collector.nodeid, "passed", None, [item])
    return report


# -- polling and processes ---------------------------------------------------------------------------------------------
def wait_for(condition, timeout: float = 60.0, message="condition", interval: float = 0.05):
    """The first truthy value of ``condition()``, polled every ``interval`` s; fail after ``timeout`` seconds,
    saying ``message`` (or what ``message()`` returns then)."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            what = message() if callable(message) else message
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(interval)


def sets(**options) -> list[str]:
    """``--set name=value`` for each option."""
    return [a for k, v in options.items() for a in ("--set", f"{k}={v}")]


def cli_env(**extra) -> dict:
    """The environment of the CLI under test: the caller's, without its ``TINYVERSE_*`` variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TINYVERSE_")}
    return {**env, "SDL_VIDEODRIVER": "dummy", "SDL_AUDIODRIVER": "dummy", **{k: str(v) for k, v in extra.items()}}


def run_cli(*args, cwd=None, timeout=120, env=None, check=True) -> subprocess.CompletedProcess:
    """Run ``python -m tinyverse ARGS`` as a real subprocess, in ``cli_env(**env)``."""
    proc = subprocess.run(
        [sys.executable, "-m", "tinyverse", *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cli_env(**(env or {})),
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"tinyverse {' '.join(map(str, args))} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


class Proc:
    """A long-running ``python -m tinyverse ARGS`` with its output in files, readable while it runs."""

    def __init__(self, args, cwd: Path, env: dict | None = None, name: str = "proc"):
        self.name, self.out, self.err = name, Path(cwd) / f"{name}.out", Path(cwd) / f"{name}.err"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            cmd = [sys.executable, "-m", "tinyverse", *map(str, args)]
            self.p = subprocess.Popen(cmd, cwd=cwd, stdout=out, stderr=err, env=env or cli_env())
        self.pid = self.p.pid

    def stderr(self) -> str:
        return self.err.read_text()

    def stdout(self) -> str:
        return self.out.read_text()

    def alive(self) -> bool:
        return self.p.poll() is None

    def running(self) -> bool:
        """True while it runs; once it has exited, an AssertionError with its stderr, so that a wait on it fails
        at once rather than at its timeout."""
        if self.alive():
            return True
        raise AssertionError(f"{self.name} exited with code {self.p.returncode}:\n{self.stderr()}")

    def stop(self, timeout: float = 30.0, sig=signal.SIGTERM) -> int:
        """Send ``sig``; its exit code (AssertionError if it does not exit within ``timeout`` seconds)."""
        if self.alive():
            self.p.send_signal(sig)
        try:
            return self.p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} still running {timeout:g} s after {sig!r}:\n{self.stderr()}") from None

    def kill(self) -> None:
        if self.alive():
            self.p.kill()
        self.p.wait()


_started: list[Proc] = []  # what spawn() started for the running test: killed before its fixtures tear down


def spawn(*args, cwd: Path, env: dict | None = None, name: str | None = None) -> Proc:
    """Start a CLI worker that dies when the test ends, before any fixture cleans up after it."""
    proc = Proc(args, cwd, env, name or f"{args[1] if len(args) > 1 else 'proc'}-{len(_started)}")
    _started.append(proc)
    return proc


def kill_started() -> None:
    while _started:
        _started.pop().kill()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    kill_started()  # the test's workers die first: then nothing writes again behind the fixtures' cleanup
    return (yield)


# -- loops in threads --------------------------------------------------------------------------------------------------
def in_thread(fn) -> tuple[threading.Thread, dict]:
    """Run ``fn()`` in a daemon thread; the dict gets its ``result`` or its ``error``."""
    outcome = {}

    def run():
        try:
            outcome["result"] = fn()
        except BaseException as e:  # raised again in the test thread
            outcome["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def joined(thread, outcome, timeout: float = 30.0, message="the loop did not stop"):
    """What the thread of :func:`in_thread` returned, once it ended; its error raised here."""
    thread.join(timeout=timeout)
    assert not thread.is_alive(), message
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def trainer_waiting(db, why: str) -> dict | None:
    """The heartbeat of a trainer whose ``waiting`` says ``why``, if any."""
    return next((w for w in db.workers() if w["role"] == "trainer" and why in (w.get("waiting") or "")), None)


def train_until_waiting(exp, db, why: str, **kwargs):
    """Train in a thread until the trainer waits ``why``, then ask it to stop through the database."""
    from tinyverse.trainer import train

    thread, outcome = in_thread(lambda: train(exp, db, **kwargs))
    try:
        wait_for(lambda: trainer_waiting(db, why), 30, f"the trainer to wait {why}")
    finally:
        for w in db.workers():
            db.request_stop(w["id"])
    return joined(thread, outcome)


# -- Redis -------------------------------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on for the whole session: a socket of the suite's holds it bound
    without listen(), so a connect is refused at once and no server (the suite's own included) can bind it. A port
    from free_port() would be free only until some later server took it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


class RedisServer:
    """A private redis-server on a free port (no persistence, in ``tmp_path``), to stop and restart by PID."""

    def __init__(self, tmp_path: Path, password: str | None = None):
        self.port, self.dir, self.proc, self.password = free_port(), tmp_path, None, password
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self):
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        cmd += ["--dir", str(self.dir), *(["--requirepass", self.password] if self.password else [])]
        self.proc = subprocess.Popen(cmd, cwd=self.dir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, password=self.password, socket_connect_timeout=0.5)
        try:
            wait_for(lambda: self._pings(client), 10, f"redis-server on port {self.port} to start")
        finally:
            client.close()
        return self

    def _pings(self, client) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"redis-server on port {self.port} exited with {self.proc.returncode}")
        try:
            return client.ping()
        except redis.ConnectionError:
            return False

    def stop(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


_redis: dict = {}  # the URL the suite's Redis tests use, and a client to clean up with


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory) -> str:
    """The suite's own redis-server on a free port, or the server ``$TINYVERSE_TEST_REDIS`` names."""
    if _skipped_redis:
        _missing(_skipped_redis[0])
    given = os.environ.get("TINYVERSE_TEST_REDIS")
    server = None
    if given:
        url = given
    elif shutil.which("redis-server"):
        server = RedisServer(tmp_path_factory.mktemp("redis")).start()
        url = server.url
    else:
        _skipped_redis.append("no redis-server: apt-get install redis-server, or set TINYVERSE_TEST_REDIS=redis://...")
        _missing(_skipped_redis[0])
    client = redis.Redis.from_url(url, socket_connect_timeout=2)
    try:
        client.ping()
    except redis.RedisError as e:
        _skipped_redis.append(f"Redis not reachable at $TINYVERSE_TEST_REDIS={url} ({e}): start it or unset it")
        _missing(_skipped_redis[0])
    _redis.update(url=url, client=client)
    yield url
    for name in _redis.pop("prefixes", set()):  # what a test left despite its own cleanup
        purge(name)
    _redis.clear()
    client.close()
    if server is not None:
        server.stop()


def purge(name: str) -> None:
    """Remove every key of the prefix ``name`` from the suite's Redis, and the prefix from its list."""
    client = _redis.get("client")
    if client is None:
        return
    keys = list(client.scan_iter(match=f"{name}:*", count=1000))
    if keys:
        client.unlink(*keys)
    client.srem(NAMESPACES, name)


def pytest_sessionfinish(session, exitstatus):
    shutil.rmtree(CACHE, ignore_errors=True)


def pytest_terminal_summary(terminalreporter):
    if _skipped_redis and not IN_CI:
        terminalreporter.write_line(f"tinyverse: the Redis tests were skipped: {_skipped_redis[0]}")


@pytest.fixture(params=["sqlite", "redis"])
def db_url(request, tmp_path) -> str:
    """A URL for each backend; the conformance suite runs once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    return request.getfixturevalue("redis_url")


def new_prefix() -> str:
    """A namespace no other test uses; its Redis keys go at the end of the session at the latest."""
    name = f"test-{uuid.uuid4().hex[:10]}"
    _redis.setdefault("prefixes", set()).add(name)
    return name


@pytest.fixture
def prefix() -> str:
    """A namespace of its own for each test; after the test's workers are dead, every key of it goes."""
    name = new_prefix()
    yield name
    kill_started()
    purge(name)
    _redis.get("prefixes", set()).discard(name)


@pytest.fixture
def db(db_url, prefix):
    database = connect(db_url, prefix, retry_for=5)
    yield database
    database.close()  # the prefix fixture, torn down after this one, removes the data


@pytest.fixture
def redis_server(tmp_path):
    if shutil.which("redis-server") is None:
        _missing("redis-server is not installed: apt-get install redis-server")
    server = RedisServer(tmp_path).start()
    yield server
    server.stop()


@pytest.fixture
def locked_redis(tmp_path):
    """A private redis-server that wants ``REDIS_PASSWORD`` (never the suite's shared one)."""
    if shutil.which("redis-server") is None:
        _missing("redis-server is not installed: apt-get install redis-server")
    server = RedisServer(tmp_path, password=REDIS_PASSWORD).start()
    yield server
    server.stop()
