"""Watching training: the info dashboard, learning-curve plots, TensorBoard files."""

import socket
import struct
import time
from pathlib import Path

import numpy as np

from .errors import TinyverseError


def _age(seconds: float) -> str:
    s = int(seconds)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def info_text(db, last: int = 100) -> str:
    """The dashboard of one namespace as text."""
    stored, added = db.count_sessions()
    version, saved = db.params_version(), db.params_time()
    workers = db.workers()
    lines = [f"[{db.prefix}] {db.url}"]
    if not (added or version or workers):
        return lines[0] + "\n  empty: start a player with python -m tinyverse EXP play"
    lines.append(f"  sessions  {stored:,} stored of {db.capacity() or 0:,} capacity, {added:,} ever added")
    lines.append(
        "  params    " + ("none" if version is None else f"version {version}, saved {_age(time.time() - saved)} ago")
    )
    now = time.time()
    for w in workers:
        if w["role"] == "player":
            rate = f"{w.get('steps_per_s', 0):,.0f} steps/s"
        else:
            rate = f"{w.get('updates_per_s', 0):,.1f} updates/s"
        used = f"  params v{w['version']}" if w.get("version") is not None else ""
        if used and w["role"] == "player" and version is not None:
            used += f", lag {version - w['version']}"  # how stale the acting policy is
        lines.append(f"  {w['role']:<8}  {w['host']} pid {w['pid']}  up {_age(now - w['started'])}  {rate}{used}")
    if not workers:
        lines.append("  workers   none alive")
    returns = [m["return"] for m in db.metrics("episodes", last)]
    if returns:
        lines.append(
            f"  returns   last {len(returns)}: mean {np.mean(returns):.1f}, "
            f"min {np.min(returns):.1f}, max {np.max(returns):.1f}"
        )
    train = db.metrics("train", 1)
    if train:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in train[-1].items() if k not in ("time", "version", "steps"))
        lines.append(f"  training  {shown} ({_age(now - train[-1]['time'])} ago)")
    return "\n".join(lines)


def plot(db, path: str) -> None:
    """Draw return vs env steps, return vs wall time, and trainer loss into a PNG."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TinyverseError("plot needs matplotlib: pip install 'tinyverse[plot]'") from None
    episodes, train = db.metrics("episodes"), db.metrics("train")
    if not episodes:
        raise TinyverseError(f"no episode returns stored under prefix {db.prefix!r}: play first, or check --prefix")
    steps = np.array([m["steps"] for m in episodes])
    returns = np.array([m["return"] for m in episodes])
    seconds = np.array([m["time"] for m in episodes]) - episodes[0]["time"]
    unit = 60 if seconds[-1] > 300 else 1
    smooth = np.convolve(returns, np.ones(k := min(20, len(returns))) / k, mode="valid")
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for ax, x, label in (
        (axes[0], steps, "env steps"),
        (axes[1], seconds / unit, f"wall time ({'minutes' if unit == 60 else 'seconds'})"),
    ):
        ax.plot(x, returns, ".", alpha=0.3, label="episode")
        ax.plot(x[k - 1 :], smooth, label=f"mean of {k}")
        ax.set(xlabel=label, ylabel="return")
        ax.legend()
    losses = [(m["updates"], m["loss"]) for m in train if "loss" in m]
    if losses:
        axes[2].plot(*zip(*losses, strict=True), ".-")
        axes[2].set(
            xlabel="trainer updates", ylabel="loss", yscale="log" if min(v for _, v in losses) > 0 else "linear"
        )
    else:
        axes[2].set_title("no trainer loss stored")
    fig.suptitle(f"{db.prefix}: {len(returns)} episodes")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def _crc32c_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for byte in data:
        c = _TABLE[(c ^ byte) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def _masked(data: bytes) -> bytes:
    c = crc32c(data)
    return struct.pack("<I", (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


class EventWriter:
    """Scalars in TensorBoard's event-file format (TFRecord of Event protos), no dependency."""

    def __init__(self, logdir: str):
        Path(logdir).mkdir(parents=True, exist_ok=True)
        self.path = Path(logdir) / f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}"
        self.file = open(self.path, "ab")
        self._write(b"\x1a" + _varint(13) + b"brain.Event:2", 0)

    def _write(self, body: bytes, step: int) -> None:
        event = b"\x09" + struct.pack("<d", time.time()) + b"\x10" + _varint(step) + body
        head = struct.pack("<Q", len(event))
        self.file.write(head + _masked(head) + event + _masked(event))

    def scalars(self, values: dict[str, float], step: int) -> None:
        summary = b""
        for tag, v in values.items():
            name = tag.encode()
            value = b"\x0a" + _varint(len(name)) + name + b"\x15" + struct.pack("<f", v)
            summary += b"\x0a" + _varint(len(value)) + value
        self._write(b"\x2a" + _varint(len(summary)) + summary, step)
        self.file.flush()

    def close(self) -> None:
        self.file.close()
