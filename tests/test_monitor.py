"""TensorBoard event files written through tensorboardX, read back record by record."""

import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, optional, run_cli
from test_database import SilentServer, beat, episode, raw_beats, raw_meta, raw_metrics, raw_records

from tinyverse.ops.launcher import progress
from tinyverse.ops.tensorboard import EventWriter

event_pb2 = optional("tensorboardX.proto.event_pb2")

FAKE = ROOT / "tests" / "fake_experiment.py"


def read_scalars(path: Path) -> list[tuple[str, int, float]]:
    """(tag, step, value) of every scalar in a TFRecord file of Event protos."""
    data, pos, out = path.read_bytes(), 0, []
    while pos < len(data):
        (n,) = struct.unpack_from("<Q", data, pos)
        event = event_pb2.Event.FromString(data[pos + 12 : pos + 12 + n])
        out += [(v.tag, event.step, v.simple_value) for v in event.summary.value]
        pos += 16 + n
    return out


def test_event_writer_writes_scalars(tmp_path):
    w = EventWriter(str(tmp_path))
    w.scalars({"train/loss": 0.5, "train/q": 2.0}, step=300)
    w.scalars({"train/loss": 0.25}, step=400)
    w.close()
    (path,) = tmp_path.glob("events.out.tfevents.*")
    assert read_scalars(path) == [("train/loss", 300, 0.5), ("train/q", 300, 2.0), ("train/loss", 400, 0.25)]


def test_trainer_logdir_writes_tensorboard_events(tmp_path):
    url = f"sqlite:///{tmp_path / 'tb.db'}"
    run_cli(FAKE, "play", "-n", "10", "--set", "max_steps=20", "--db", url, cwd=tmp_path)
    run_cli(FAKE, "train", "-n", "10", "--logdir", "tb", "--db", url, cwd=tmp_path)
    (path,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    tags = {tag for tag, _, _ in read_scalars(path)}
    assert {"train/loss", "return/recent_mean"} <= tags


# -- a database full of junk: info, plot, run's progress and clear still work ------------------------------------------
def fill_with_junk(db) -> None:
    """Good data of every kind, and beside it heartbeats and metrics that tinyverse never writes."""
    db.add_sessions([{"x": np.zeros(3)}] * 4, capacity=10)
    db.save_params({"w": np.ones(2)})
    db.heartbeat("player-good", beat("player-good", steps_per_s=12.0, version=1))
    db.add_metrics("episodes", [episode(float(r), steps=10 * r) for r in range(30)])
    db.add_metrics("train", [{"time": time.time(), "updates": 5, "loss": 0.25, "worker": "t", "note": "text"}])
    raw_beats(db, {"junk-1": "not json", "junk-2": json.dumps({**beat("x"), "pid": "7"}), "junk-3": "[]"})
    raw_metrics(db, "episodes", ["not json", '{"return": "high", "time": 1}', '{"return": 1.0}', "{" * 5000])
    raw_metrics(db, "train", ['{"loss": "low", "updates": 1}', '{"worker": {"a": 1}}', '{"time": "now"}'])


def test_info_plot_progress_and_clear_work_with_a_database_full_of_junk(db, db_url, tmp_path):
    fill_with_junk(db)
    args = ["--db", db_url, "--prefix", db.prefix]
    info = run_cli("info", *args, cwd=tmp_path)
    assert "player    box pid 7  up " in info.stdout and "12 steps/s  params v1, lag 0" in info.stdout, info.stdout
    assert "returns   last 30: mean 14.5" in info.stdout and "training  updates 5, loss 0.25 (" in info.stdout
    assert "skipped 3 malformed heartbeats" in info.stderr and "Traceback" not in info.stderr
    assert "wrote curve.png" in run_cli("plot", "-o", "curve.png", *args, cwd=tmp_path).stdout
    assert progress(db) == ["sessions 4", "params v1", "return 21.5 (last 16)"]  # of the last 20, 16 were good
    db.remove_worker("player-good")  # clear would ask it to stop and wait for it a while
    cleared = run_cli("clear", "--all", *args, cwd=tmp_path)
    assert f"{db.prefix}: cleared sessions, params, metrics" in cleared.stdout
    assert db.workers() == [] and db.metrics("episodes") == [] and db.metrics("train") == []
    assert raw_records(db) == [] and db.count_sessions().stored == 0


@pytest.mark.parametrize("key", ["capacity", "corrupt", "options"])
def test_a_junk_setting_is_one_line_in_info_and_clear_all_deletes_it(db, db_url, tmp_path, key):
    fill_with_junk(db)
    raw_meta(db, key, "junk")
    args = ["--db", db_url, "--prefix", db.prefix]
    info = run_cli("info", *args, cwd=tmp_path, check=False)
    (line,) = [line for line in info.stderr.splitlines() if "error" in line]  # beside the warnings of junk skipped
    assert info.returncode == 1 and "Traceback" not in info.stderr, info.stderr
    assert line.startswith(f"tinyverse: error: setting {key!r} of prefix {db.prefix}") and "clear --all" in line
    db.remove_worker("player-good")
    run_cli("clear", "--all", *args, cwd=tmp_path)
    assert "empty: start a player" in run_cli("info", *args, cwd=tmp_path).stdout


def test_info_gives_up_on_a_silent_server_in_one_line_within_seconds(tmp_path):
    server = SilentServer()
    try:
        started = time.monotonic()
        proc = run_cli("info", "--db", f"redis://127.0.0.1:{server.port}/0", cwd=tmp_path, check=False, timeout=60)
        assert time.monotonic() - started < 20 and proc.returncode == 1
        assert proc.stderr.count("\n") == 1 and "cannot reach database" in proc.stderr, proc.stderr
    finally:
        server.close()
