"""TensorBoard event files written through tensorboardX, read back record by record."""

import struct
from pathlib import Path

from conftest import ROOT, optional, run_cli

from tinyverse.ops.monitor import EventWriter

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
