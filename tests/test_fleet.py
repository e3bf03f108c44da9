"""Operating a fleet: run, remote stop, info, plot and TensorBoard files, through real processes."""

import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, run_cli

from tinyverse.database import connect
from tinyverse.monitor import EventWriter, crc32c, info_text

FAKE = ROOT / "tests" / "fake_experiment.py"


def wait_for(condition, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_run_stops_after_steps_publishes_and_evaluates(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    out = run_cli(FAKE, "run", "--players", "2", "-n", "1500", "--eval-episodes", "2", "--db", url, cwd=tmp_path)
    assert "run stopped: reached" in out.stdout
    assert "mean return" in out.stdout and out.stdout.count("episode ") == 2
    db = connect(url, "fake_experiment")
    assert db.count_sessions()[1] * 8 >= 1500
    assert db.workers() == []  # every worker left cleanly
    version, params = db.load_params()  # (test_run_ctrl_c checks that trained params get published)
    # run again: it continues from what is stored
    run_cli(FAKE, "run", "-n", "200", "--eval-episodes", "0", "--db", url, cwd=tmp_path)
    assert db.params_version() > version
    assert db.load_params()[1]["updates"][0] >= params["updates"][0]


def test_run_stops_at_target_return(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    out = run_cli(FAKE, "run", "--target-return", "1", "--eval-episodes", "0", "--db", url, cwd=tmp_path)
    assert "reached the target 1.0" in out.stdout


def test_run_restarts_a_crashing_worker_then_gives_up(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    out = run_cli(FAKE, "run", "--max-crashes", "2", "--db", url, cwd=tmp_path, env={"FAKE_FAIL_AT": "1"}, check=False)
    assert out.returncode == 1
    assert "trainer-0 exited with code 1; restarting in 1s" in out.stderr
    assert "restarting trainer-0" in out.stderr
    assert "tinyverse: error: trainer-0 crashed 2 times" in out.stderr
    assert "RuntimeError: train_step failed at update 1" in out.stderr  # its output is shown
    db = connect(url, "fake_experiment")
    assert wait_for(lambda: db.workers() == [], 15, "the player to leave")
    assert not np.isnan(db.load_params()[1]["w"]).any()  # the failed trainer published nothing


def test_run_ctrl_c_stops_every_worker(tmp_path):
    url = f"sqlite:///{tmp_path / 'fleet.db'}"
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy"}
    cmd = [sys.executable, "-m", "tinyverse", str(FAKE), "run", "--players", "2", "--db", url]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        db = connect(url, "fake_experiment")
        workers = wait_for(lambda: len(db.workers()) == 3 and db.workers(), 60, "three workers")
        wait_for(lambda: (db.metrics("train", 1) or [{}])[-1].get("updates", 0) > 0 or db.params_version() > 1, 60)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "run stopped: interrupted" in out
    for w in workers:  # every child exited
        assert not Path(f"/proc/{w['pid']}").exists() or "Z" in Path(f"/proc/{w['pid']}/stat").read_text().split()[2]
    assert db.workers() == []
    assert db.load_params()[1]["updates"][0] > 0


def test_a_worker_asked_to_stop_through_the_database_stops(tmp_path, db_url, prefix):
    """What clear does for workers on other machines: they stop within a heartbeat period."""
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy"}
    cmd = [sys.executable, "-m", "tinyverse", str(FAKE), "play", "--db", db_url, "--prefix", prefix]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    db = connect(db_url, prefix, retry_for=5)
    try:
        (worker,) = wait_for(db.workers, 60, "the player's heartbeat")
        db.request_stop(worker["id"])
        proc.wait(timeout=15)
        assert proc.returncode == 0
        assert "asked to stop through the database" in proc.stderr.read()
        assert db.workers() == []
    finally:
        proc.kill()
        db.clear(sessions=True, params=True, workers=True, metrics=True)


def test_info_shows_the_fleet(tmp_path):
    url = f"sqlite:///{tmp_path / 'info.db'}"
    empty = run_cli("info", "--db", url, cwd=tmp_path)
    assert "no experiments" in empty.stdout
    run_cli(FAKE, "play", "-n", "20", "--db", url, cwd=tmp_path, env={"FAKE_MAX_STEPS": "20"})  # episodes end
    db = connect(url, "fake_experiment")
    db.heartbeat(
        "trainer-x",
        {"role": "trainer", "host": "gpu-box", "pid": 42, "started": time.time() - 300, "updates_per_s": 12.5},
    )
    db.heartbeat(
        "player-y",
        {"role": "player", "host": "laptop", "pid": 7, "started": time.time() - 90, "steps_per_s": 1234, "version": 0},
    )
    db.save_params(db.load_params()[1])  # version 2: the player above acts with params 2 versions old
    out = run_cli(FAKE, "info", "--db", url, cwd=tmp_path).stdout
    assert "[fake_experiment]" in out
    assert "sessions  40 stored" in out  # 20 rounds of the fake's 2 environments
    assert "params    version 2, saved" in out
    assert "trainer   gpu-box pid 42  up 5m  12.5 updates/s\n" in out
    assert "player    laptop pid 7  up 90s  1,234 steps/s  params v0, lag 2" in out
    assert "returns   last" in out
    assert run_cli("info", "--db", url, cwd=tmp_path).stdout.startswith("[fake_experiment]")


def test_info_says_when_redis_is_unreachable(tmp_path):
    from conftest import free_port

    t0 = time.monotonic()
    out = run_cli("info", "--db", f"redis://127.0.0.1:{free_port()}/0", cwd=tmp_path, check=False)
    assert out.returncode == 1 and time.monotonic() - t0 < 60
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("tinyverse: error: cannot reach database redis://127.0.0.1") and "--db" in last
    assert "Traceback" not in out.stderr


def test_plot_writes_a_png(tmp_path):
    url = f"sqlite:///{tmp_path / 'plot.db'}"
    missing = run_cli(FAKE, "plot", "--db", url, cwd=tmp_path, check=False)
    assert missing.returncode == 1 and "no episode returns stored" in missing.stderr
    run_cli(FAKE, "play", "-n", "30", "--db", url, cwd=tmp_path, env={"FAKE_MAX_STEPS": "20"})
    run_cli(FAKE, "train", "-n", "20", "--db", url, cwd=tmp_path)
    out = run_cli(FAKE, "plot", "-o", "curve.png", "--db", url, cwd=tmp_path)
    png = (tmp_path / "curve.png").read_bytes()
    assert "wrote curve.png" in out.stdout
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def read_events(path: Path) -> list[bytes]:
    """Read a TFRecord file, checking both masked CRCs of every record."""

    def masked(data):
        c = crc32c(data)
        return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

    data, pos, records = path.read_bytes(), 0, []
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        assert struct.unpack_from("<I", data, pos + 8)[0] == masked(data[pos : pos + 8])
        body = data[pos + 12 : pos + 12 + n]
        assert struct.unpack_from("<I", data, pos + 12 + n)[0] == masked(body)
        records.append(body)
        pos += 16 + n
    return records


def test_crc32c_matches_the_standard_check_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_event_writer_writes_scalar_records(tmp_path):
    w = EventWriter(str(tmp_path))
    w.scalars({"train/loss": 0.5}, step=300)
    w.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    first, second = read_events(path)
    assert first.endswith(b"brain.Event:2")
    assert b"\x10" + bytes([300 & 0x7F | 0x80, 300 >> 7]) in second  # step 300 as a varint
    assert b"train/loss" in second and struct.pack("<f", 0.5) in second


def test_trainer_logdir_writes_tensorboard_events(tmp_path):
    url = f"sqlite:///{tmp_path / 'tb.db'}"
    run_cli(FAKE, "play", "-n", "10", "--db", url, cwd=tmp_path, env={"FAKE_MAX_STEPS": "20"})
    run_cli(FAKE, "train", "-n", "10", "--logdir", "tb", "--db", url, cwd=tmp_path)
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    records = read_events(path)
    assert any(b"train/loss" in r for r in records) and any(b"return/recent_mean" in r for r in records)


@pytest.mark.parametrize("text", ["empty"])
def test_info_text_of_an_empty_namespace(db, text):
    assert text in info_text(db)


def test_deleting_data_under_live_workers_never_resets_params(tmp_path):
    """clear --del-*: players and trainers carry on; deleted params come back trained, not random."""
    url = f"sqlite:///{tmp_path / 'live.db'}"
    env = {**os.environ, "SDL_VIDEODRIVER": "dummy", "FAKE_TRAIN_SLEEP": "0.005"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tinyverse", str(FAKE), mode, *extra, "--db", url],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        for mode, extra in (("play", []), ("train", ["-s", "5"]))
    ]
    db = connect(url, "fake_experiment")
    try:
        wait_for(lambda: (p := db.load_params()) and p[1]["updates"][0] >= 20, 60, "trained params")
        trained_w = db.load_params()[1]["w"]
        run_cli(FAKE, "clear", "--del-weights", "--db", url, cwd=tmp_path)
        back = wait_for(db.load_params, 30, "params to come back")
        assert back[1]["updates"][0] > 0, "params came back as a random init"
        np.testing.assert_array_equal(back[1]["w"], trained_w)

        run_cli(FAKE, "clear", "--del-sessions", "--del-metrics", "--db", url, cwd=tmp_path)
        added = db.count_sessions()[1]
        wait_for(lambda: db.count_sessions()[1] > added + 10 and db.metrics("episodes"), 30, "new sessions")
        assert all(p.poll() is None for p in procs), "a worker died"
        assert db.load_params()[1]["updates"][0] >= back[1]["updates"][0]
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=30) == 0, p.stderr.read()


def test_clear_asks_workers_on_other_machines_to_stop(tmp_path):
    url = f"sqlite:///{tmp_path / 'remote.db'}"
    db = connect(url, "fake_experiment")
    remote = {"id": "player-far-1", "role": "player", "host": "far-away-box", "pid": os.getpid(), "started": 0}
    db.heartbeat(remote["id"], remote, ttl=60)
    out = run_cli(FAKE, "clear", "--kill-players", "--db", url, cwd=tmp_path)
    assert f"asked player pid {os.getpid()} on far-away-box to stop" in out.stdout
    assert db.stop_requested(remote["id"])  # its next heartbeat sees this and it stops
    assert not db.stop_requested("player-near-2")
