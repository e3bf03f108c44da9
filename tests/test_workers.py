"""Workers: registration and heartbeats, waiting while heartbeating, warm shutdown on signals (in the loops too)."""

import hashlib
import json
import os
import signal
import socket
import stat
import subprocess
import time
from pathlib import Path

import psutil
import pytest
from conftest import REDIS_PASSWORD, ROOT, in_thread, joined, run_cli, spawn, wait_for
from fake_experiment import FakeExperiment

from tinyverse import identity
from tinyverse.database import connect
from tinyverse.errors import masked
from tinyverse.player import play
from tinyverse.trainer import train
from tinyverse.workers import HEARTBEAT_EVERY, Worker, digest


def registered(db, worker) -> dict | None:
    return next((w for w in db.workers() if w["id"] == worker.id), None)


def test_a_worker_registers_on_entering_and_leaves_on_exit_even_after_an_error(db):
    worker = Worker(db, "player")
    assert registered(db, worker) is None, "registered only as a context"
    with pytest.raises(RuntimeError), worker:
        info = registered(db, worker)
        assert info["role"] == "player" and info["pid"] == os.getpid() and info["host"]
        assert info["cmdline"] == digest(psutil.Process()) and "time" in info
        raise RuntimeError("a loop failed")
    assert registered(db, worker) is None


def test_the_command_line_is_stored_as_a_digest(db):
    me = psutil.Process()
    assert digest(me) == hashlib.sha256("\0".join(me.cmdline()).encode()).hexdigest()[:16]
    with Worker(db, "trainer") as worker:
        assert " " not in registered(db, worker)["cmdline"], "a --password on the command line stays out of the db"


def test_heartbeats_carry_counters_at_most_every_two_seconds(db):
    with Worker(db, "trainer") as worker:
        first = registered(db, worker)["time"]
        assert worker.beat(updates=3) is False
        assert "updates" not in registered(db, worker), "a beat within 2 s only records the counters"
        assert worker.beat(force=True) is False
        again = registered(db, worker)
        assert again["updates"] == 3 and again["time"] >= first


def test_a_stop_request_is_heard_at_the_next_heartbeat(db):
    with Worker(db, "player") as worker:
        assert worker.beat(force=True) is False and not worker.stop
        db.request_stop(worker.id)
        assert worker.beat(sessions=1) is False and not worker.stop, "no look at the database within 2 s"
        assert worker.beat(force=True) is True and worker.stop, "asked: the loops see worker.stop"
    assert registered(db, worker) is None


def test_a_waiting_worker_says_why_and_a_stop_request_ends_the_wait(db):
    worker = Worker(db, "trainer")
    steps = []

    def wait_then_step():  # as the loops wait: idle while something is missing, then work
        while worker.idle("for players"):
            pass
        if not worker.stop:
            steps.append(1)

    with worker:
        thread, outcome = in_thread(wait_then_step)
        waiting = wait_for(lambda: (registered(db, worker) or {}).get("waiting"), 30, "the reason in the heartbeat")
        assert waiting == "for players"
        db.request_stop(worker.id)
        joined(thread, outcome)
    assert steps == [] and worker.stop, "no step without what it waited for"


def test_a_beat_after_the_wait_clears_the_reason(db):
    with Worker(db, "trainer") as worker:
        assert worker.idle("for a batch") and worker.info["waiting"] == "for a batch"
        worker.beat(force=True, updates=1)
        assert worker.info["waiting"] is None and registered(db, worker)["waiting"] is None


def test_sigterm_finishes_the_round_then_stops_and_a_second_signal_interrupts(db):
    def sigterm_in_round(rnd):
        if rnd == 2:
            os.kill(os.getpid(), signal.SIGTERM)  # handled in this (main) thread before kill returns

    before = signal.getsignal(signal.SIGTERM)
    exp = FakeExperiment(db, on_round=sigterm_in_round)
    assert play(exp, db, batch_size=2) == 4, "the round finished, no other began"
    assert db.count_sessions().added == 4 and not db.workers()
    assert signal.getsignal(signal.SIGTERM) is before, "the handlers are restored"
    with Worker(db, "player") as worker:
        os.kill(os.getpid(), signal.SIGTERM)
        assert worker.stop and not worker.idle("for the trainers"), "a wait ends on a stop"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGTERM) is before


def test_sigterm_finishes_the_update_then_publishes_and_stops(db):
    def sigterm_in_update(n):
        if n == 3:
            os.kill(os.getpid(), signal.SIGTERM)

    play(FakeExperiment(db), db, batch_size=2, rounds=2)
    exp = FakeExperiment(db, on_train=sigterm_in_update)
    version = train(exp, db, batch_size=2, save_every=100)  # for ever, but for the signal
    assert version == db.params_version() and db.load_params()[1]["updates"][0] == 3, "a warm stop publishes"
    assert not db.workers()


# -- the token that lets clear signal a worker, and nothing else -------------------------------------------------------
FAKE = ROOT / "tests" / "fake_experiment.py"


@pytest.fixture
def tokens(tmp_path, monkeypatch) -> Path:
    """The token folder of this test's workers, theirs alone (the CLIs it starts inherit it)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return identity.folder()


def heartbeat_of(db, pid: int) -> dict | None:
    return next((w for w in db.workers() if w["pid"] == pid), None)


def forged(pid: int, host: str = socket.gethostname()) -> dict:
    """A heartbeat naming a process by what anyone can read in /proc: PID, start time, command line."""
    p = psutil.Process(pid)
    info = {"id": f"player-{host}-{pid}-forged", "role": "player", "host": host, "pid": pid, "started": time.time()}
    return info | {"proc_start": p.create_time(), "cmdline": digest(p)}


def test_a_worker_keeps_a_private_token_while_it_runs_without_the_password(locked_redis, tokens):
    db = connect(locked_redis.url, "tokens", retry_for=5)
    with Worker(db, "player") as worker:
        token = identity.path_of(worker.id)
        assert stat.S_IMODE(tokens.stat().st_mode) == 0o700 and stat.S_IMODE(token.stat().st_mode) == 0o600
        assert REDIS_PASSWORD not in token.read_text()
        expected = {k: worker.info[k] for k in ("id", "role", "host", "pid", "proc_start")}
        assert json.loads(token.read_text()) == expected | {"prefix": "tokens", "db": masked(locked_redis.url)}
        assert identity.vouched(db, registered(db, worker)).pid == os.getpid()
    assert not token.exists(), "a worker that leaves takes its token with it"
    db.close()


def test_clear_signals_only_the_workers_its_tokens_vouch_for(tmp_path, tokens):
    url, other_url = f"sqlite:///{tmp_path / 'fleet.db'}", f"sqlite:///{tmp_path / 'other.db'}"
    db, theirs, elsewhere = connect(url, "mine"), connect(url, "theirs"), connect(other_url, "theirs")
    player = spawn(FAKE, "play", "-b", 1, "--db", url, "--prefix", "mine", cwd=tmp_path)
    stranger = spawn(FAKE, "play", "-b", 1, "--db", url, "--prefix", "theirs", cwd=tmp_path)
    sleeper = subprocess.Popen(["sleep", "120"])
    try:
        player_info = wait_for(lambda: heartbeat_of(db, player.pid), 60, "the player's heartbeat")
        stranger_info = wait_for(lambda: heartbeat_of(theirs, stranger.pid), 60, "the stranger's heartbeat")
        for pid in (sleeper.pid, os.getpid()):  # what a heartbeat written by hand can name today
            db.heartbeat(forged(pid)["id"], forged(pid), 60)
        db.heartbeat(stranger_info["id"], stranger_info, 60)  # a worker of another prefix, word for word
        elsewhere.heartbeat(stranger_info["id"], stranger_info, 60)  # its prefix, in another database
        far = forged(os.getpid(), host="far-away-box")
        db.heartbeat(far["id"], far, 60)

        out = run_cli(FAKE, "clear", "--kill-players", "--db", other_url, "--prefix", "theirs", cwd=tmp_path).stdout
        assert f"player pid {stranger.pid} left alone: its token names another namespace (theirs in" in out
        out = run_cli(FAKE, "clear", "--kill-players", "--db", url, "--prefix", "mine", cwd=tmp_path).stdout
        cleared = time.time()
        assert f"mine: stopped player pid {player.pid}" in out and player.p.wait(timeout=30) == 0
        assert not identity.path_of(player_info["id"]).exists(), "its token left with it"
        for pid in (sleeper.pid, os.getpid()):
            assert f"player pid {pid} left alone: no token of this user for it" in out
        assert f"player pid {stranger.pid} left alone: its token names another namespace (theirs in" in out
        assert f"asked player pid {os.getpid()} on far-away-box to stop" in out and db.stop_requested(far["id"])

        sleeper.kill()
        assert sleeper.wait() == -signal.SIGKILL, "clear signalled a process that merely had a heartbeat"
        beats = lambda: heartbeat_of(theirs, stranger.pid)["time"] > cleared + 2 * HEARTBEAT_EVERY  # noqa: E731
        wait_for(beats, 30, "the stranger to go on heartbeating")
        assert "got SIGTERM" not in stranger.stderr(), "clear signalled a worker of another prefix"
        assert stranger.stop() == 0, stranger.stderr()
    finally:
        sleeper.kill()
        sleeper.wait()
        for d in (db, theirs, elsewhere):
            d.close()


def test_the_tokens_of_killed_workers_are_swept_when_a_worker_starts(tmp_path, tokens):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    db = connect(url, "swept")
    killed = spawn(FAKE, "play", "-b", 1, "--db", url, "--prefix", "swept", cwd=tmp_path)
    gone = identity.path_of(wait_for(lambda: heartbeat_of(db, killed.pid), 60, "the player's heartbeat")["id"])
    killed.kill()  # SIGKILL: it cannot remove its token
    far = tokens / "far.json"  # a worker of another host sharing this home: its process is not here to look at
    far.write_text(json.dumps(forged(os.getpid(), host="far-away-box")))
    far.chmod(0o600)
    assert gone.exists()
    with Worker(db, "player") as worker:
        assert not gone.exists(), "the token of a killed worker outlived the next start"
        assert far.exists() and worker.token.exists()
    db.close()


@pytest.mark.parametrize("spoil", ["open to others", "a link", "of another user"])
def test_a_token_folder_that_is_not_private_is_refused(tmp_path, tokens, spoil, caplog):
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o700)
    tokens.parent.mkdir(parents=True)
    if spoil == "a link":
        tokens.symlink_to(mine)  # a link to a private folder of this user: still not the folder itself
    else:
        tokens.mkdir(mode=0o700)
    if spoil == "open to others":
        tokens.chmod(0o777)
    if spoil == "of another user":
        if os.getuid() != 0:
            pytest.skip("only root can give a folder to another user")
        os.chown(tokens, 65534, 65534)
    db = connect(f"sqlite:///{tmp_path / 'test.db'}", "refused")
    with Worker(db, "player") as worker:
        assert worker.token is None and "is not a private folder of uid" in caplog.text
        assert os.listdir(tokens) == [], "nothing is written into a folder that is not private"
        assert "is not a private folder" in identity.vouched(db, registered(db, worker))
    db.close()


def test_a_token_file_counts_only_if_it_is_a_private_plain_file_of_this_user(tmp_path, tokens):
    db = connect(f"sqlite:///{tmp_path / 'test.db'}", "tokens")
    with Worker(db, "player") as worker:
        heartbeat, token = registered(db, worker), worker.token
        assert identity.vouched(db, heartbeat).pid == os.getpid()
        token.chmod(0o644)
        assert "no token" in identity.vouched(db, heartbeat), "a token others could read"
        token.chmod(0o600)
        moved = token.rename(tmp_path / "elsewhere.json")
        token.symlink_to(moved)
        assert "no token" in identity.vouched(db, heartbeat), "a link instead of the token"
        token.unlink()
        moved.rename(token)
        if os.getuid() == 0:  # only root can give a file to another user
            os.chown(token, 65534, 65534)
            assert "no token" in identity.vouched(db, heartbeat), "a token of another user"
            os.chown(token, 0, 0)
        assert identity.vouched(db, heartbeat | {"pid": 1}) == "its token names another worker"
        assert identity.vouched(db, heartbeat).pid == os.getpid()
    db.close()
