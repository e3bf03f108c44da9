"""A hostile writer to the database: malformed, oversized, mistyped and forged values in every key tinyverse reads.

Each case seeds a namespace the way a run does (options, sessions, params, metrics, a heartbeat), writes one hostile
value with the raw client (redis-py or sqlite3, not through tinyverse), then runs the modes a user would run next
as real processes. Every mode must either work or exit 1 with one line, within a deadline; the read-only modes
(info, eval, export, plot) must leave every key as it was; ``clear --all`` must always clean the namespace up, and a
bystander namespace in the same database is never touched.
"""

import json
import os
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import redis
from conftest import ROOT, cli_env, purge, wait_for

from tinyverse.database import connect
from tinyverse.encoding import MAGIC, encode
from tinyverse.loader import load_experiment
from tinyverse.player import play
from tinyverse.trainer import train

FAKE = ROOT / "tests" / "fake_experiment.py"
DEADLINE = 60.0  # seconds any mode may take on a hostile database (tools give up after a few)
LOG_LINE = r"^\d\d:\d\d:\d\d "  # the CLI's log lines: time, logger, level


def bomb() -> bytes:
    """A 1 MB-ish params record declaring four 256 MiB zlib arrays: refused without allocating them."""
    zeros = zlib.compress(bytes(2**20), 9)  # 1 MiB of zeros in ~1 KB: the header claims far more
    head = [[f"w{i}", "<f4", [2**26], "zlib", len(zeros)] for i in range(4)]
    text = json.dumps(head).encode()
    return MAGIC + struct.pack("<I", len(text)) + text + zeros * 4


def forged_heartbeat() -> str:
    """A heartbeat naming this test process (host, pid, start time, command line digest all readable by anyone)."""
    import psutil

    from tinyverse.workers import digest

    me = psutil.Process()
    info = {"id": "player-forged", "role": "player", "host": os.uname().nodename, "pid": me.pid}
    info |= {"started": time.time(), "proc_start": me.create_time(), "cmdline": digest(me), "time": time.time()}
    return json.dumps(info)


# (name, table or key, field, value): what one hostile writer puts where tinyverse reads
CASES = [
    ("options not JSON", "meta", "options", "{not json"),
    ("options a list", "meta", "options", "[1, 2]"),
    ("option of the wrong type", "meta", "options", json.dumps({"session_length": "abc"})),
    ("option absurdly large", "meta", "options", json.dumps({"session_length": 10**12})),
    ("option zero", "meta", "options", json.dumps({"session_length": 0})),
    ("unknown option", "meta", "options", json.dumps({"rm_rf": True})),
    ("layout not JSON", "meta", "layout", "garbage"),
    ("layout of objects", "meta", "layout", json.dumps([["observations", "|O", [4]]])),
    ("capacity a word", "meta", "capacity", "abc"),
    ("capacity negative", "meta", "capacity", "-5"),
    ("update counter a word", "meta", "updates", "abc"),
    ("corrupt counter a float", "meta", "corrupt", "1.5"),
    ("stop request a word", "meta", "stop:player-x", "abc"),
    ("params version a word", "params", "version", "abc"),
    ("params version negative", "params", "version", "-3"),
    ("params version huge", "params", "version", str(2**70)),
    ("params data garbage", "params", "data", b"\x00garbage"),
    ("params zlib bomb", "params", "data", bomb()),
    ("snapshot version a word", "snapshots", "version", "abc"),
    ("snapshot time huge", "snapshots", "time", "1e400"),
    ("snapshot data garbage", "snapshots", "data", b"\x00garbage"),
    ("snapshot zlib bomb", "snapshots", "data", bomb()),
    ("session garbage", "sessions", 1, b"TVR1\xff\xff\xff\xffjunk"),
    ("heartbeat not JSON", "workers", "player-junk", "{{{"),
    ("heartbeat a list", "workers", "player-list", "[]"),
    ("heartbeat mistyped", "workers", "player-typed", json.dumps({"id": 5, "role": ["x"], "pid": "me"})),
    ("heartbeat forged", "workers", "player-forged", forged_heartbeat()),
    ("episode not JSON", "metrics", "episodes", "nope"),
    ("episode return a word", "metrics", "episodes", json.dumps({"return": "x", "time": 1, "steps": 1})),
    ("episode a list", "metrics", "episodes", "[]"),
    ("train metric a word", "metrics", "train", json.dumps({"loss": "x", "time": "y", "updates": None})),
]


class Raw:
    """Write and read a namespace's storage behind tinyverse's back."""

    def __init__(self, url: str, prefix: str):
        self.url, self.prefix = url, prefix
        self.sqlite = url.startswith("sqlite")
        if self.sqlite:
            self.path = url.split("sqlite:///", 1)[1]
        else:
            self.r = redis.Redis.from_url(url)

    def write(self, where: str, field, value) -> None:
        if self.sqlite:
            with sqlite3.connect(self.path) as c:
                table = f'"{self.prefix}:{where}"'
                if where == "meta":
                    c.execute(f"INSERT OR REPLACE INTO {table} VALUES (?, ?)", (field, value))
                elif where == "params":
                    c.execute(f"UPDATE {table} SET {field} = ?", (value,))
                elif where == "snapshots":
                    c.execute(f"UPDATE {table} SET {field} = ? WHERE name = 'passed'", (value,))
                elif where == "sessions":
                    c.execute(f"UPDATE {table} SET data = ? WHERE id = (SELECT min(id) FROM {table})", (value,))
                elif where == "workers":
                    c.execute(f"INSERT INTO {table} VALUES (?, ?, ?)", (field, value, time.time() + 3600))
                elif where == "metrics":
                    c.execute(f"INSERT INTO {table} (kind, data) VALUES (?, ?)", (field, value))
            return
        p = self.prefix
        if where in ("meta", "params"):
            self.r.hset(f"{p}:{where}", field, value)
        elif where == "snapshots":
            self.r.hset(f"{p}:snapshot:passed", field, value)
        elif where == "sessions":
            self.r.hset(f"{p}:sessions", int(self.r.get(f"{p}:lo") or 1), value)
        elif where == "workers":
            self.r.set(f"{p}:worker:{field}", value, ex=3600)
        elif where == "metrics":
            self.r.rpush(f"{p}:metrics:{field}", value)

    def snapshot(self) -> dict:
        """Every stored value of the namespace but the heartbeats (live workers rewrite theirs)."""
        if self.sqlite:
            with sqlite3.connect(self.path) as c:
                tables = [r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
                mine = [t for t in tables if t.startswith(f"{self.prefix}:") and not t.endswith(":workers")]
                return {t: sorted(map(repr, c.execute(f'SELECT * FROM "{t}"'))) for t in mine}
        keys = [k for k in self.r.scan_iter(match=f"{self.prefix}:*") if b":worker:" not in k]
        return {k: self.value(k) for k in sorted(keys)}

    def value(self, key: bytes):
        """A Redis key's value, compared as data (DUMP's bytes depend on the encoding's history)."""
        kind = self.r.type(key)
        if kind == b"hash":
            return self.r.hgetall(key)
        if kind == b"list":
            return self.r.lrange(key, 0, -1)
        if kind == b"set":
            return self.r.smembers(key)
        return self.r.get(key)

    def close(self) -> None:
        if not self.sqlite:
            self.r.close()


def seeded(url: str, prefix: str) -> None:
    """A namespace as a short run leaves it: options, sessions, params, the snapshot its verdict kept, episodes,
    trainer metrics."""
    db = connect(url, prefix, retry_for=5)
    try:
        exp = load_experiment(str(FAKE), db, {"max_steps": "5"})  # 5-step episodes: returns get stored
        play(exp, db, batch_size=2, rounds=3)
        train(exp, db, batch_size=2, updates=2, save_every=1, report_every=0)
        db.save_snapshot("passed", *db.load_params()[::-1])
        # a stop never waits for a sample: the one in flight ends on its own, and would remove the garbage a
        # case writes next (as a trainer must), not a read-only mode
        sampling = lambda: [t for t in threading.enumerate() if t.name == "prefetch"]  # noqa: E731
        wait_for(lambda: not sampling(), 30, "the seeding trainer's last sample to end")
    finally:
        db.close()


def tinyverse(url: str, prefix: str, *args, cwd) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "tinyverse", str(FAKE), *args, "--db", url, "--prefix", prefix]
    try:
        return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=DEADLINE, env=cli_env())
    except subprocess.TimeoutExpired:
        raise AssertionError(f"hung: tinyverse {' '.join(args)} still running after {DEADLINE:g} s") from None


def one_line_or_works(proc: subprocess.CompletedProcess, what: str) -> None:
    """Exit 0, or exit 1 with one ``tinyverse: error:`` line besides the log lines; never a traceback."""
    import re

    assert "Traceback" not in proc.stderr, f"{what}: a traceback\n{proc.stderr[-3000:]}"
    if proc.returncode == 0:
        return
    said = [line for line in proc.stderr.splitlines() if line.strip() and not re.match(LOG_LINE, line)]
    assert proc.returncode == 1, f"{what}: exit {proc.returncode}\n{proc.stderr[-3000:]}"
    assert len(said) == 1 and said[0].startswith("tinyverse: error: "), f"{what}: not one line\n{proc.stderr}"


READ_ONLY = {
    "info": ("info",),
    "eval": ("eval", "-n", "1", "--no-record"),
    "export": ("export", "-o", "agent.safetensors"),
    "plot": ("plot", "-o", "curve.png"),
}
WRITERS = {"play": ("play", "-n", "1", "-b", "1"), "train": ("train", "-n", "1", "-b", "2")}
# the modes that read each kind of key (every case also ends with clear --all)
READERS = {
    "meta": ["info", "eval", "export", "play", "train"],
    "params": ["info", "eval", "export", "play", "train"],
    "snapshots": ["info", "export"],
    "sessions": ["info", "play", "train"],
    "workers": ["info", "play", "train"],
    "metrics": ["info", "plot", "train"],
}


def run_all(url: str, prefix: str, modes: list[str], cwd) -> None:
    """Run ``modes`` two at a time (the machine has two cores); each works or says one line."""
    with ThreadPoolExecutor(2) as pool:
        done = {m: pool.submit(tinyverse, url, prefix, *(READ_ONLY | WRITERS)[m], cwd=cwd) for m in modes}
    for mode, future in done.items():
        one_line_or_works(future.result(), mode)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_mode_works_or_says_one_line_and_clear_cleans_up(db_url, prefix, tmp_path, case):
    _, where, field, value = case
    bystander = f"{prefix}-bystander"
    seeded(db_url, bystander)
    seeded(db_url, prefix)
    raw, other = Raw(db_url, prefix), Raw(db_url, bystander)
    try:
        raw.write(where, field, value)
        before, theirs = raw.snapshot(), other.snapshot()
        run_all(db_url, prefix, [m for m in READERS[where] if m in READ_ONLY], tmp_path)
        assert raw.snapshot() == before, "a read-only mode changed the namespace"
        run_all(db_url, prefix, [m for m in READERS[where] if m in WRITERS], tmp_path)
        cleared = tinyverse(db_url, prefix, "clear", "--all", cwd=tmp_path)
        assert cleared.returncode == 0, cleared.stderr
        assert "Traceback" not in cleared.stderr
        assert other.snapshot() == theirs, "the bystander namespace changed"
        assert connect(db_url, prefix, retry_for=5).count_sessions().stored == 0
    finally:
        raw.close()
        other.close()
        if not db_url.startswith("sqlite"):
            purge(bystander)


def test_the_hostile_params_bomb_is_refused_without_its_memory(db_url, prefix):
    """The record declares 1 GiB; refusing it must not allocate it (measured as this process's peak growth)."""
    import resource

    seeded(db_url, prefix)
    raw = Raw(db_url, prefix)
    try:
        raw.write("params", "data", bomb())
        db = connect(db_url, prefix, retry_for=5)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with pytest.raises(Exception) as refused:
            db.load_params()
        assert type(refused.value).__module__.startswith("tinyverse"), refused.value
        grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
        assert grown_mib < 64, f"refusing the record took {grown_mib:.0f} MiB"
        db.close()
    finally:
        raw.close()


def test_a_forged_heartbeat_naming_this_process_gets_nothing_signalled(db_url, prefix, tmp_path):
    seeded(db_url, prefix)
    raw = Raw(db_url, prefix)
    try:
        raw.write("workers", "player-forged", forged_heartbeat())
        # were it signalled, this test process would get SIGTERM and the test would die here
        proc = tinyverse(db_url, prefix, "clear", "--kill-players", cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert "left alone" in proc.stdout, proc.stdout
    finally:
        raw.close()


def test_the_seeded_namespace_is_what_the_cases_attack(db_url, prefix):
    """The cases write where a run writes: each table or key they target exists after the seed."""
    seeded(db_url, prefix)
    db = connect(db_url, prefix, retry_for=5)
    try:
        assert db.count_sessions().stored == 6
        assert db.params_version() is not None and [s.name for s in db.snapshots()] == ["passed"]
        assert db.setting("options")["max_steps"] == 5
        assert db.metrics("episodes") and db.metrics("train")
        assert np.asarray(db.load_params()[1]["updates"]).sum() == 2
        assert encode({"x": np.zeros(3)})[:4] == MAGIC
    finally:
        db.close()
