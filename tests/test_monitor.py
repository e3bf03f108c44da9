"""Watching a run: TensorBoard event files (read back record by record), plot and info over restarts,
the bottleneck named, the options listed; info, plot and clear on a database full of junk."""

import json
import re
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, optional, run_cli
from fake_experiment import FakeExperiment
from test_database import SilentServer, beat, episode, raw_beats, raw_meta, raw_metrics, raw_records

from tinyverse.database import connect
from tinyverse.ops.launcher import progress
from tinyverse.ops.monitor import info_text
from tinyverse.ops.plot import active_minutes, loss_series
from tinyverse.ops.tensorboard import EventWriter
from tinyverse.pace import Pace

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


def test_plot_info_and_tensorboard_carry_on_over_a_restarted_trainer(tmp_path):
    url = f"sqlite:///{tmp_path / 'restart.db'}"
    run_cli(FAKE, "play", "-n", "10", "--set", "max_steps=20", "--db", url, cwd=tmp_path)
    for _ in range(2):  # a run stopped, then continued: two trainer processes in sequence
        run_cli(FAKE, "train", "-n", "10", "--logdir", "tb", "--db", url, cwd=tmp_path)
    reports = connect(url, "fake_experiment").metrics("train")
    restart = next(i for i, r in enumerate(reports) if r["worker"] != reports[0]["worker"])
    assert reports[restart]["updates"] <= reports[restart - 1]["updates"], "each process counts from 0"
    xs = [x for x, _ in loss_series(reports)]
    assert xs[restart] > xs[restart - 1] and xs == sorted(xs) and xs[-1] == 20, xs  # the run's count goes on
    scalars = [s for path in (tmp_path / "tb").glob("events.out.tfevents.*") for s in read_scalars(path)]
    assert sorted(step for tag, step, _ in scalars if tag == "train/loss") == xs, "TensorBoard on the run's count"
    assert {"train/loss", "run/env_steps", "return/recent_mean"} <= {tag for tag, _, _ in scalars}
    plot = run_cli(FAKE, "plot", "-o", "curve.png", "--db", url, cwd=tmp_path)
    assert "wrote curve.png" in plot.stdout and (tmp_path / "curve.png").stat().st_size > 10_000
    info = run_cli(FAKE, "info", "--db", url, cwd=tmp_path).stdout
    assert "  stopped   2 trainers, the last " in info and "  training  " not in info, info


def test_the_loss_of_reports_without_the_run_count_carries_on_from_each_trainers_count():
    reports = [{"updates": 5, "loss": 1.0, "worker": "a"}, {"updates": 10, "loss": 0.5, "worker": "a"}]
    reports += [
        {"updates": 4, "loss": 0.25, "worker": "b"},
        {"updates": 4, "loss": 0.5, "worker": "b", "run_updates": "x"},
    ]
    assert loss_series(reports) == [(5, 1.0), (10, 0.5), (14, 0.25), (14, 0.5)]


def test_active_wall_time_leaves_out_the_pause_between_two_runs():
    t = [1000.0, 1060.0, 1120.0, 1119.0, 1120.0 + 3600, 1120.0 + 3660]  # a late append, then an hour's pause
    np.testing.assert_allclose(active_minutes(t), [0, 1, 2, 2, 2, 3])


def test_info_lists_live_trainers_apart_from_those_that_stopped(db):
    now = time.time()
    reports = [("trainer-a", 600, 100, 0.5), ("trainer-b", 300, 200, 0.25), ("trainer-live", 1, 7, 0.125)]
    db.add_metrics("train", [{"time": now - ago, "updates": n, "loss": x, "worker": w} for w, ago, n, x in reports])
    db.heartbeat("trainer-live", beat("trainer-live", role="trainer", updates_per_s=3.5))
    lines = info_text(db).splitlines()
    (live,) = [line for line in lines if line.startswith("  training")]
    assert live.startswith("  training  updates 7, loss 0.125 (") and live.endswith("s ago)")
    assert [line for line in lines if line.startswith("  stopped")] == [
        "  stopped   2 trainers, the last 5m ago: updates 200, loss 0.25"
    ]


def pace_of(db, **options) -> tuple[Pace, dict]:
    """A pace of 0.25 updates an env step, with 80 env steps played."""
    db.add_sessions([{"x": np.zeros(3)}] * 10, capacity=10)
    pace = Pace(FakeExperiment(db, updates_per_step=0.25, pace_slack=0, **options), db)
    return pace, pace.spec


def test_info_and_run_name_a_slow_trainer_as_the_bottleneck(db):
    pace, spec = pace_of(db)
    waiting = pace.player_waits()  # 0 updates for 80 env steps: the player waits, as a real one says
    db.heartbeat("player-1", beat("player-1", steps_per_s=70.0, pace=spec, waiting=waiting))
    db.heartbeat("trainer-1", beat("trainer-1", role="trainer", updates_per_s=5.9, pace=spec))
    assert (
        "  limit     trainers are the bottleneck: 5.9 updates/s hold the players to 70 env steps/s at 0.25 "
        "updates an env step; a smaller network, a larger -b per update, or more trainers\n" in info_text(db) + "\n"
    )
    assert progress(db)[-1] == "bottleneck: the trainers"


def test_info_and_run_name_slow_players_as_the_bottleneck_once_learning_started(db):
    pace, spec = pace_of(db, learning_starts=1000)
    db.heartbeat("player-1", beat("player-1", steps_per_s=20.0, pace=spec))
    warming = beat("trainer-1", role="trainer", updates_per_s=5.0, pace=spec, waiting=pace.trainer_waits())
    db.heartbeat("trainer-1", warming)
    assert "before learning starts" in warming["waiting"] and "limit" not in info_text(db), "warming up: no verdict"
    pace, spec = pace_of(db)
    db.add_to_counter("updates", 100)  # ahead of the 40 updates that 160 env steps allow
    db.heartbeat("trainer-1", {**warming, "pace": spec, "waiting": pace.trainer_waits()})
    assert (
        "players are the bottleneck: 20 env steps/s hold the trainers to 5 updates/s at 0.25 updates an env "
        "step; more players (run --players)" in info_text(db)
    )
    assert progress(db)[-1] == "bottleneck: the players"


def test_info_names_the_database_when_trainers_wait_for_batches(db):
    spec = pace_of(db)[1]
    db.heartbeat("player-1", beat("player-1", steps_per_s=20.0, pace=spec))
    slow = "for a batch (sampling is slow, or skips corrupt or foreign records)"  # what trainer.py says
    db.heartbeat("trainer-1", beat("trainer-1", role="trainer", updates_per_s=5.0, pace=spec, waiting=slow))
    assert "  limit     the database is the bottleneck: trainers wait for batches to be sampled" in info_text(db)


def test_import_help_lists_the_options_of_the_experiment(tmp_path):
    out = run_cli(FAKE, "import", "--help", cwd=tmp_path).stdout
    assert f"options of {FAKE} (--set NAME=VALUE):" in out and "required" not in out, out
    assert out.rstrip().splitlines()[-1].startswith("  report_epsilon=False (bool)")
    missing = run_cli(FAKE, "import", cwd=tmp_path, check=False)  # without --help the file is still required
    assert missing.returncode == 1 and "the following arguments are required: file" in missing.stderr


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
    assert "returns   last 30: mean 14.5 ± 8.66, min 0, max 29.0" in info.stdout
    assert re.search(r"^  stopped   1 trainer, the last \d+s ago: updates 5, loss 0.25$", info.stdout, re.M), (
        info.stdout
    )
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
