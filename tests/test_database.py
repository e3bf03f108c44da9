"""The database contract: one conformance suite, run against every backend through the ``db`` fixture.

Backend-specific code is limited to writing and reading raw records past the
encoder (to plant foreign or damaged data) and to checking, without timing
anything, that sampling does a bounded amount of work whatever the number of
sessions stored.
"""

import inspect
import json
import logging
import multiprocessing
import pickle
import random
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections import Counter

import numpy as np
import pytest
import redis
from conftest import in_thread, wait_for

from tinyverse import every
from tinyverse.database import Database, connect, control, masked
from tinyverse.database.redis import RedisDatabase
from tinyverse.database.sqlite import TABLES, SQLiteDatabase
from tinyverse.encoding import decode, encode, layout
from tinyverse.errors import DatabaseError, RecordError, TinyverseError

BIG = 10**6
SESSION_KEYS = {"observations", "actions", "terminated", "frames", "who"}


# -- helpers -----------------------------------------------------------------------


def make_session(i: int, worker: int = 0) -> dict:
    """A session whose every array is derived from (worker, i), so damage shows."""
    v = worker * 10_000 + i
    return {
        "observations": np.full((26, 4), v, np.float32),
        "actions": np.arange(25, dtype=np.int64) + v,
        "terminated": np.arange(25) % 5 == v % 5,
        "frames": np.full((64, 64), v % 251, np.uint8),  # 4 KiB of uint8: stored compressed
        "who": np.array([worker, i], np.int64),
    }


def check_session(s: dict, sampled: bool = True) -> tuple[int, int]:
    """Assert a session is intact; return its (worker, i). Sampled sessions also carry their ``id``."""
    assert set(s) == SESSION_KEYS | ({"id"} if sampled else set())
    if sampled:
        assert s["id"].dtype == np.int64 and s["id"].shape == () and s["id"] >= 1
    worker, i = (int(x) for x in s["who"])
    want = make_session(i, worker)
    for k, v in want.items():
        assert s[k].dtype == v.dtype and s[k].shape == v.shape, k
        np.testing.assert_array_equal(s[k], v, err_msg=k)
    return worker, i


def size(batch: dict) -> int:
    """How many sessions a batch holds (``{}``: none)."""
    return len(batch["id"]) if batch else 0


def rows(batch: dict) -> list[dict]:
    """A stacked batch cut back into its sessions."""
    return [{k: v[j] for k, v in batch.items()} for j in range(size(batch))]


def check_batch(batch: dict) -> list[tuple[int, int]]:
    """Assert every session of a batch is intact; return their (worker, i)."""
    if batch:
        assert set(batch) == SESSION_KEYS | {"id"}
        assert all(v.flags.writeable for v in batch.values())
    return [check_session(s) for s in rows(batch)]


def tiny(i: int) -> dict:
    return {"i": np.array(i, np.int64)}


def markers(batch: dict) -> list[int]:
    return batch["i"].tolist() if batch else []


def params_of(v: int) -> dict:
    """A params set whose every value is ``v``: a mix of two publishes cannot pass for one."""
    return {
        "w": np.full((128, 256), v, np.float32),
        "b": np.full(2048, v, np.float64),
        "steps": np.array(v, np.int64),
        "z": np.full((3, 3, 3), v, np.int32),
    }


def is_sqlite(db) -> bool:
    return isinstance(db, SQLiteDatabase)


def raw_add(db, sessions: list[dict]) -> None:
    """Append sessions past the layout claim, as players of a version before layouts were claimed did."""
    db._call(db._add, [encode(s) for s in sessions], BIG)


def raw_insert(db, data) -> None:
    """Append a record straight into the backend, bypassing the encoder, as a foreign writer would."""
    if is_sqlite(db):
        conn = sqlite3.connect(db.path, timeout=30)
        with conn:
            conn.execute(f'INSERT INTO "{db.prefix}:sessions" (data) VALUES (?)', (data,))
        conn.close()
    else:
        r = redis.Redis.from_url(db.url)
        r.hset(f"{db.prefix}:sessions", r.incr(f"{db.prefix}:seq"), data)
        r.close()


def raw_overwrite(db, session_id: int, data: bytes) -> None:
    """Replace a stored record in place (a disk or a foreign writer damaging it)."""
    if is_sqlite(db):
        conn = sqlite3.connect(db.path, timeout=30)
        with conn:
            changed = conn.execute(f'UPDATE "{db.prefix}:sessions" SET data = ? WHERE id = ?', (data, session_id))
            assert changed.rowcount == 1
        conn.close()
    else:
        r = redis.Redis.from_url(db.url)
        assert r.hset(f"{db.prefix}:sessions", session_id, data) == 0  # 0: an existing field was replaced
        r.close()


def raw_records(db) -> list[tuple[int, bytes]]:
    """Every stored session record as (id, raw bytes), read straight from the backend.

    SQLite keeps an empty record in place of a removed one until it is evicted (so that the
    stored range and the count stay, as in Redis): those are left out.
    """
    if is_sqlite(db):
        conn = sqlite3.connect(db.path, timeout=30)
        sql = f"SELECT id, data FROM \"{db.prefix}:sessions\" WHERE data != x'' ORDER BY id"
        rows = conn.execute(sql).fetchall()
        conn.close()
        return rows
    r = redis.Redis.from_url(db.url)
    rows = sorted((int(k), v) for k, v in r.hgetall(f"{db.prefix}:sessions").items())
    r.close()
    return rows


def beat(worker_id: str, **more) -> dict:
    """A heartbeat as workers write them: what readers use, and ``more``."""
    return {"id": worker_id, "role": "player", "host": "box", "pid": 7, "started": 1.0, **more}


def episode(r: float, **more) -> dict:
    """An episode's metrics record as players write them."""
    return {"return": r, "time": 1.0 + r, "steps": 10, **more}


def warnings_about(caplog, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("tinyverse") and text in r.getMessage()]


class Clock:
    """``time`` for the database module, with a monotonic clock that can jump forward."""

    def __init__(self):
        self.offset = 0.0
        self.time, self.sleep = time.time, time.sleep

    def monotonic(self) -> float:
        return time.monotonic() + self.offset


def everything(db) -> None:
    db.clear(sessions=True, params=True, workers=True, metrics=True)


# -- real processes: small scripts run with the helpers above, importing only the core --------


def child_script(main: str) -> str:
    helpers = [inspect.getsource(f) for f in (make_session, params_of)]
    head = "import os, sys, time\nimport numpy as np\nfrom tinyverse.database import connect\n"
    return "\n\n".join([head, *helpers, textwrap.dedent(main)])


WRITE_SESSIONS = child_script(
    """
    url, prefix = sys.argv[1:3]
    worker, n, capacity = map(int, sys.argv[3:6])
    gate = sys.argv[6] if len(sys.argv) > 6 else ""  # halfway, wait (up to 60 s) for this file to exist
    db = connect(url, prefix, retry_for=60)
    for i in range(n):
        if gate and i == n // 2:
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.01)
        db.add_sessions([make_session(i, worker)], capacity=capacity)
    """
)

PUBLISH_PARAMS = child_script(
    """
    url, prefix, stop_file = sys.argv[1:]
    db = connect(url, prefix, retry_for=60)
    v = (db.params_version() or 0) + 1
    while not os.path.exists(stop_file):
        got = db.save_params(params_of(v), min_version=v)
        assert got == v, f"published version {got}, expected {v}"
        v += 1
    """
)


def start(script: str, *args) -> subprocess.Popen:
    cmd = [sys.executable, "-c", script, *map(str, args)]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def join_all(procs: list[subprocess.Popen], timeout: float = 120.0) -> None:
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    failed = [p.stderr.read() for p in procs if p.returncode != 0]
    for p in procs:
        p.stderr.close()
    assert not failed, failed


def in_threads(n: int, fn) -> list:
    """Run ``fn(k)`` in ``n`` threads released together; return their results in order."""
    barrier, results, errors = threading.Barrier(n), [None] * n, []

    def run(k):
        try:
            barrier.wait(30)
            results[k] = fn(k)
        except BaseException as e:  # raised again in the test thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]
    return results


# -- the conformance suite: every test runs once per backend -----------------------


class TestSessions:
    def test_empty_database(self, db):
        assert db.count_sessions() == (0, 0)
        assert db.sample_batch(5) == {} and db.get_batch([1, 2]) == {}
        assert db.capacity() is None
        assert db.counter("updates") == 0 and db.counter("corrupt") == 0

    def test_the_first_append_claims_a_capacity_that_later_ones_keep(self, db):
        db.add_sessions([tiny(0)])  # no capacity given: as many as fit the budget, within 1,000 .. 10^6
        assert db.capacity() == 10**6 and db.count_sessions() == (1, 1)
        db.add_sessions([tiny(1), tiny(2)], capacity=2)  # another worker's default does not override it
        assert db.capacity() == 10**6 and db.count_sessions() == (3, 3)

    def test_a_prefix_holds_one_layout(self, db):
        db.add_sessions([tiny(0)], capacity=BIG)
        with pytest.raises(TinyverseError, match="another layout .*i: stored .* --del-sessions"):
            db.add_sessions([{"i": np.arange(2)}], capacity=BIG)
        assert db.count_sessions() == (1, 1), "nothing of the other layout was stored"
        fresh = type(db).__new__(type(db))  # another process: it claims too, and is refused as well
        fresh.__dict__.update(db.__dict__, layout=None)
        with pytest.raises(TinyverseError, match="another layout"):
            fresh.add_sessions([{"i": np.arange(2)}], capacity=BIG)

    def test_append_count_sample(self, db):
        db.add_sessions([make_session(i) for i in range(3)], capacity=BIG)
        db.add_sessions([make_session(3)], capacity=BIG)
        assert db.count_sessions() == (4, 4)
        batch = db.sample_batch(50)
        assert size(batch) == 50
        assert set(check_batch(batch)) <= {(0, i) for i in range(4)}

    @pytest.mark.parametrize("n", [0, 1, 7, 300])
    def test_sample_returns_n_items_in_one_call(self, db, n):
        db.add_sessions([tiny(i) for i in range(3)], capacity=BIG)
        batch = db.sample_batch(n)
        assert size(batch) == n  # with replacement: more than stored is fine
        assert set(markers(batch)) <= {0, 1, 2}
        assert batch == {} if n == 0 else batch["i"].shape == (n,)

    def test_sampling_is_uniform(self, db):
        db.add_sessions([tiny(i) for i in range(10)], capacity=BIG)
        counts = Counter(markers(db.sample_batch(5000)))
        assert set(counts) == set(range(10))
        # 500 expected each, standard deviation ~21: a loose band that only a biased sampler leaves
        assert all(350 < c < 650 for c in counts.values()), counts

    def test_sampling_is_uniform_over_the_stored_ids(self, db):
        random.seed(7)  # every backend draws with Python's random: the counts below are the same each run
        db.add_sessions([tiny(i) for i in range(60)], capacity=48)  # ids 13..60 stored
        db._call(db._delete, [13, 20, 41, 60])  # removed: drawn, found missing, drawn again
        stored = sorted(set(range(13, 61)) - {13, 20, 41, 60})
        counts = Counter(i for _ in range(88) for i in db.sample_batch(50)["id"].tolist())
        assert sorted(counts) == stored
        expected = 88 * 50 / len(stored)  # 100 each
        chi2 = sum((counts[i] - expected) ** 2 / expected for i in stored)
        assert chi2 < 90, counts  # 43 degrees of freedom: 43 on average, past 90 once in 30,000 runs

    def test_a_batch_never_holds_an_evicted_id_and_takes_in_new_ones(self, db):
        """The ring turns over between batches, by 0 to 3 sessions: Redis draws from the range its last
        batch saw, widened by what it had grown, and must still cover the whole range now."""
        random.seed(8)
        db.add_sessions([tiny(i) for i in range(20)], capacity=20)
        added, newest = 20, 0
        for k in range(200):
            db.add_sessions([tiny(added + j) for j in range(k % 4)], capacity=20)
            added += k % 4
            batch = db.sample_batch(40)
            assert db.session_range() == (added - 19, added)
            assert size(batch) == 40 and added - 19 <= batch["id"].min() and batch["id"].max() <= added
            assert (batch["id"] == batch["i"] + 1).all(), "each session under the id it was added with"
            newest += int((batch["id"] == added).sum())
        assert 300 < newest < 500, newest  # 2 a batch on average: 400

    def test_eviction_keeps_exactly_the_newest(self, db):
        db.add_sessions([tiny(i) for i in range(3)], capacity=5)
        db.add_sessions([tiny(i) for i in range(3, 12)], capacity=5)  # one call past capacity
        db.add_sessions([tiny(12)], capacity=5)
        assert db.count_sessions() == (5, 13)
        batch = db.sample_batch(400)
        assert set(markers(batch)) == {8, 9, 10, 11, 12}
        assert (batch["id"] == batch["i"] + 1).all(), "each session carries the id it was added under"
        assert [i for i, _ in raw_records(db)] == [9, 10, 11, 12, 13]

    def test_the_first_capacity_sticks(self, db):
        db.add_sessions([tiny(0)], capacity=4)
        assert db.capacity() == 4
        db.add_sessions([tiny(i) for i in range(1, 10)], capacity=100)
        assert db.capacity() == 4
        assert db.count_sessions() == (4, 10)

    def test_an_append_does_not_override_a_set_capacity(self, db):
        db.set_capacity(3)  # as play/train --buffer-size do before the first session
        db.add_sessions([tiny(i) for i in range(10)], capacity=100)
        assert db.capacity() == 3
        assert db.count_sessions() == (3, 10)
        assert [i for i, _ in raw_records(db)] == [8, 9, 10]

    def test_capacity_set_later_evicts_at_once(self, db, caplog):
        db.add_sessions([tiny(i) for i in range(10)], capacity=100)
        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            db.set_capacity(3)
        [said] = warnings_about(caplog, "buffer size")  # every worker's buffer changes: say so, with both sizes
        assert "100" in said and "3" in said.replace("100", "")
        assert db.capacity() == 3
        assert db.count_sessions() == (3, 10)
        assert [i for i, _ in raw_records(db)] == [8, 9, 10]  # evicted now, not at the next append
        assert set(markers(db.sample_batch(200))) == {7, 8, 9}
        db.set_capacity(6)
        db.add_sessions([tiny(i) for i in range(10, 15)], capacity=100)
        assert db.capacity() == 6
        assert db.count_sessions() == (6, 15)
        assert set(markers(db.sample_batch(300))) == set(range(9, 15))

    def test_setting_the_same_capacity_again_is_quiet(self, db, caplog):
        db.set_capacity(5)
        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            db.set_capacity(5)
        assert db.capacity() == 5 and not warnings_about(caplog, "buffer size")

    @pytest.mark.parametrize("bad", [0, -5, 1.5, True, "9", 2**60, None])
    def test_capacity_must_be_a_positive_count_checked_before_it_is_stored(self, db, bad):
        db.set_capacity(7)
        with pytest.raises(DatabaseError, match="^buffer size is .*: nothing was stored$"):
            db.set_capacity(bad)
        assert db.capacity() == 7

    def test_an_empty_append_changes_nothing(self, db):
        db.add_sessions([tiny(i) for i in range(5)], capacity=5)
        db.add_metrics("episodes", [{"return": float(i)} for i in range(50)])  # other rows, same connection
        db.add_sessions([], capacity=5)
        assert db.count_sessions() == (5, 5)
        assert set(markers(db.sample_batch(200))) == set(range(5))

    def test_twenty_thousand_sessions(self, db):
        for begin in range(0, 20_000, 2_000):
            db.add_sessions([tiny(i) for i in range(begin, begin + 2_000)], capacity=BIG)
        assert db.count_sessions() == (20_000, 20_000)
        got = markers(db.sample_batch(256))
        assert len(got) == 256 and all(0 <= i < 20_000 for i in got)
        assert len(set(got)) > 200  # draws spread over the whole range, not a few rows
        db.set_capacity(1_000)
        assert db.count_sessions() == (1_000, 20_000)
        got = markers(db.sample_batch(256))
        assert len(got) == 256 and all(19_000 <= i < 20_000 for i in got)


class TestSessionIds:
    def test_range_and_get_by_id(self, db):
        lo, hi = db.session_range()
        assert hi < lo
        assert db.get_batch([1, 2]) == {} and db.get_batch([]) == {}
        db.add_sessions([tiny(i) for i in range(10)], capacity=6)
        assert db.session_range() == (5, 10)
        batch = db.get_batch([10, 5, 4, 7, 7, 99])  # evicted, repeated and unknown ids
        assert batch["id"].tolist() == [10, 5, 7, 7] and markers(batch) == [9, 4, 6, 6]
        assert db.get_batch(np.array([8, 6]))["id"].tolist() == [8, 6]  # NumPy ids, as a sampler has them
        db.clear(sessions=True)
        lo, hi = db.session_range()
        assert hi < lo and db.get_batch([5, 10]) == {}

    def test_batches_stack_whole_sessions_with_their_ids(self, db):
        assert db.sample_batch(4) == {} and db.get_batch([1, 2]) == {} and db.get_batch([]) == {}
        db.add_sessions([make_session(i) for i in range(10)], capacity=6)  # ids 5..10 stay
        batch = db.sample_batch(16)
        assert set(batch) == SESSION_KEYS | {"id"}
        assert batch["id"].dtype == np.int64 and batch["id"].shape == (16,)
        assert batch["observations"].shape == (16, 26, 4) and batch["frames"].shape == (16, 64, 64)
        assert set(batch["id"].tolist()) <= set(range(5, 11))
        assert [(0, i - 1) for i in batch["id"].tolist()] == check_batch(batch)
        batch = db.get_batch([10, 5, 4, 7, 7, 99])  # evicted, repeated and unknown ids
        assert batch["id"].tolist() == [10, 5, 7, 7]
        assert check_batch(batch) == [(0, 9), (0, 4), (0, 6), (0, 6)]
        assert db.sample_batch(0) == {}

    def test_batches_are_writable_and_independent(self, db):
        db.add_sessions([make_session(i) for i in range(3)], capacity=BIG)
        first = db.get_batch([1, 2, 3])
        for v in first.values():
            v[...] = 0  # a trainer may normalize in place
        assert check_batch(db.get_batch([1, 2, 3])) == [(0, 0), (0, 1), (0, 2)]

    def test_sampled_ids_fetch_the_same_sessions(self, db):
        db.add_sessions([make_session(i) for i in range(20)], capacity=BIG)
        sampled = db.sample_batch(8)
        again = db.get_batch(sampled["id"])
        assert again["id"].tolist() == sampled["id"].tolist()
        assert check_batch(again) == check_batch(sampled)


class TestLayout:
    def test_without_a_layout_a_batch_takes_the_first_good_one(self, db, caplog):
        raw_add(db, [tiny(i) for i in range(3)])
        raw_add(db, [{"i": np.arange(2)}])  # the experiment changed (written before layouts were claimed)
        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            batch = db.get_batch([1, 4, 2, 3])
        assert batch["id"].tolist() == [1, 2, 3] and markers(batch) == [0, 1, 2]
        assert warnings_about(caplog, "another layout") and "--del-sessions" in caplog.text
        assert db.counter("corrupt") == 0 and [i for i, _ in raw_records(db)] == [1, 2, 3, 4]

    def test_sessions_of_another_layout_are_skipped_never_returned_nor_deleted(self, db, caplog):
        old = {"i": np.arange(2)}  # an earlier experiment's sessions, stored first
        raw_add(db, [old, old])
        raw_add(db, [tiny(i) for i in range(3)])
        raw_add(db, [old])
        db.layout = db.claim("layout", layout(tiny(0)))  # as a trainer does with the players' claim
        assert db.layout == [["i", "<i8", []]]
        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            by_id = db.get_batch([1, 3, 2, 4, 6, 5, 5])
            sampled = [db.sample_batch(50) for _ in range(5)]
        assert by_id["id"].tolist() == [3, 4, 5, 5] and markers(by_id) == [0, 1, 2, 2]
        for batch in sampled:
            assert 0 < size(batch) < 50  # 3 of the 6 ids hold the layout: 50 draws all of it is ~1e-15
            assert batch["i"].shape == (size(batch),) and set(markers(batch)) <= {0, 1, 2}
            assert (batch["id"] == batch["i"] + 3).all()
        assert len(warnings_about(caplog, "another layout")) == 1  # once per interval, not once per batch
        assert db.counter("corrupt") == 0
        assert [i for i, _ in raw_records(db)] == [1, 2, 3, 4, 5, 6] and db.count_sessions() == (6, 6)

        db.layout = layout(old)  # and the other way round: the old sessions were kept intact
        batch = db.get_batch([1, 2, 3, 4, 5, 6])
        assert batch["id"].tolist() == [1, 2, 6] and batch["i"].tolist() == [[0, 1]] * 3

    def test_nothing_of_the_layout_gives_an_empty_batch(self, db):
        raw_add(db, [{"i": np.arange(2)} for _ in range(3)])
        db.layout = db.claim("layout", layout(tiny(0)))  # as the players of this experiment do
        assert db.sample_batch(20) == {} and db.get_batch([1, 2, 3]) == {}
        assert db.count_sessions() == (3, 3) and db.counter("corrupt") == 0
        assert [i for i, _ in raw_records(db)] == [1, 2, 3]  # left alone for the experiment they belong to


class TestCorruptRecords:
    def test_corrupt_and_foreign_records_are_removed_once_and_counted(self, db, caplog, tmp_path):
        target = tmp_path / "pwned"

        class Payload:
            def __reduce__(self):
                return (open, (str(target), "w"))

        db.add_sessions([tiny(i) for i in range(4)], capacity=BIG)
        bad = [
            b"garbage",
            pickle.dumps(Payload()),
            pickle.dumps({"i": np.array(1)}),
            encode(tiny(99))[:-3],  # truncated
            encode(tiny(99)) + b"x",  # trailing bytes
        ]
        if is_sqlite(db):  # SQLite stores whatever type it is given
            bad += ["a text value", 12345, 1.5]
        for data in bad:
            raw_insert(db, data)
        good_ids, bad_ids = [1, 2, 3, 4], list(range(5, 5 + len(bad)))
        assert [i for i, _ in raw_records(db)] == good_ids + bad_ids

        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            batch = db.get_batch([5, 1, 6, 2, 5, *bad_ids, 3, 4])
            assert batch["id"].tolist() == [1, 2, 3, 4] and markers(batch) == [0, 1, 2, 3]
            assert db.counter("corrupt") == len(bad)  # each once, though id 5 was asked for twice
            assert [i for i, _ in raw_records(db)] == good_ids  # removed for good
            assert db.get_batch(good_ids + bad_ids)["id"].tolist() == good_ids
            for _ in range(5):
                assert set(markers(db.sample_batch(64))) <= {0, 1, 2, 3}
            assert db.counter("corrupt") == len(bad)  # not met again
        assert len(warnings_about(caplog, "corrupt")) == 1
        assert "removed" in caplog.text and "corrupt or foreign record" in caplog.text
        assert not target.exists()

        db.add_sessions([tiny(4)], capacity=BIG)  # and the store goes on
        assert 4 in markers(db.sample_batch(500))

    def test_sampling_removes_what_it_meets(self, db, caplog):
        db.add_sessions([tiny(i) for i in range(4)], capacity=BIG)
        for data in (b"junk", encode(tiny(98))[:-1], b"TVR1", encode(tiny(99))[:-3]):
            raw_insert(db, data)  # ids 5..8
        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            for _ in range(50):  # each batch meets every stored id with odds 1 - (7/8)^64
                batch = db.sample_batch(64)
                assert set(markers(batch)) <= {0, 1, 2, 3} and 0 < size(batch) <= 64
                if db.counter("corrupt") == 4:
                    break
        assert db.counter("corrupt") == 4, "sampling met all of them and counted each once"
        assert [i for i, _ in raw_records(db)] == [1, 2, 3, 4]
        assert len(warnings_about(caplog, "corrupt")) == 1
        for _ in range(3):
            assert set(markers(db.sample_batch(64))) <= {0, 1, 2, 3}
        assert db.counter("corrupt") == 4

    def test_a_record_truncated_in_the_store_counts(self, db):
        db.add_sessions([make_session(i) for i in range(5)], capacity=BIG)
        blob = dict(raw_records(db))[3]
        raw_overwrite(db, 3, blob[: len(blob) // 2])
        batch = db.get_batch([1, 2, 3, 4, 5])
        assert batch["id"].tolist() == [1, 2, 4, 5]
        assert check_batch(batch) == [(0, 0), (0, 1), (0, 3), (0, 4)]
        assert db.counter("corrupt") == 1
        assert [i for i, _ in raw_records(db)] == [1, 2, 4, 5]
        assert db.get_batch([3]) == {} and db.counter("corrupt") == 1

    def test_a_damaged_frame_counts(self, db):
        """A record whose header is fine but whose compressed frames no longer inflate."""
        db.add_sessions([make_session(i) for i in range(3)], capacity=BIG)
        blob = bytearray(dict(raw_records(db))[2])
        blob[-16 - 3] ^= 0xFF  # in the checksum of "frames" (zlib data), just before "who" (16 bytes)
        raw_overwrite(db, 2, bytes(blob))
        assert check_batch(db.get_batch([1, 2, 3])) == [(0, 0), (0, 2)]
        assert db.counter("corrupt") == 1 and [i for i, _ in raw_records(db)] == [1, 3]

    def test_the_warning_comes_at_most_once_per_interval(self, db, caplog, monkeypatch):
        clock = Clock()
        monkeypatch.setattr(every, "time", clock)  # the throttle of warnings (every.Every) reads this clock
        db.add_sessions([tiny(0)], capacity=BIG)

        def damage(n: int) -> list[int]:
            hi = db.count_sessions()[1]  # the last id handed out
            for _ in range(n):
                raw_insert(db, b"junk")
            return list(range(hi + 1, hi + 1 + n))

        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            for _ in range(5):
                assert markers(db.get_batch([1, *damage(3)])) == [0]
            assert db.counter("corrupt") == 15
            assert len(warnings_about(caplog, "corrupt")) == 1
            clock.offset += 29
            db.get_batch(damage(2))
            assert len(warnings_about(caplog, "corrupt")) == 1
            clock.offset += 2  # past the 30 s interval
            db.get_batch(damage(2))
            assert len(warnings_about(caplog, "corrupt")) == 2
        assert db.counter("corrupt") == 19

    def test_a_removed_record_counts_as_stored_until_evicted(self, db):
        db.add_sessions([tiny(i) for i in range(5)], capacity=BIG)
        raw_overwrite(db, 5, b"junk")  # the newest
        raw_overwrite(db, 1, b"junk")  # the oldest
        assert markers(db.get_batch([1, 2, 3, 4, 5])) == [1, 2, 3]
        assert db.counter("corrupt") == 2
        assert db.count_sessions() == (5, 5)

    def test_an_empty_record_is_never_handed_out(self, db):
        db.add_sessions([tiny(i) for i in range(3)], capacity=BIG)
        raw_overwrite(db, 2, b"")  # SQLite's mark of a removed record: already removed there, corrupt in Redis
        assert markers(db.get_batch([1, 2, 3])) == [0, 2]
        assert set(markers(db.sample_batch(100))) == {0, 2}
        assert db.counter("corrupt") <= 1 and db.count_sessions() == (3, 3)
        assert [i for i, _ in raw_records(db)] == [1, 3]


class TestSettings:
    def test_the_first_claim_wins(self, db, db_url):
        assert db.setting("options") is None
        assert db.claim("options", {"lr": 0.1, "env_id": "CartPole-v1", "seed": None}) == {
            "lr": 0.1,
            "env_id": "CartPole-v1",
            "seed": None,
        }
        assert db.claim("options", {"lr": 0.2}) == {"lr": 0.1, "env_id": "CartPole-v1", "seed": None}
        assert db.setting("options")["lr"] == 0.1
        assert db.claim("layout", [["i", "<i8", []]]) == [["i", "<i8", []]]  # keys are independent
        other = connect(db_url, db.prefix, retry_for=5)  # another worker sees the same
        try:
            assert other.claim("options", {"lr": 0.3})["lr"] == 0.1
            assert other.setting("layout") == [["i", "<i8", []]]
        finally:
            other.close()

    def test_concurrent_claims_agree(self, db, db_url):
        keys = [f"k{j}" for j in range(20)]

        def claim_all(k: int) -> list:
            mine = connect(db_url, db.prefix, retry_for=30)
            try:
                return [mine.claim(key, {"by": k}) for key in keys]
            finally:
                mine.close()

        results = in_threads(6, claim_all)
        for j, key in enumerate(keys):
            answers = [r[j] for r in results]
            assert all(a == answers[0] for a in answers), (key, answers)
            assert answers[0] in [{"by": k} for k in range(6)] and db.setting(key) == answers[0]

    def test_updates_add_up(self, db):
        assert db.counter("updates") == 0
        assert db.add_to_counter("updates", 3) == 3
        assert db.add_to_counter("updates", 4) == 7
        assert db.counter("updates") == 7
        assert db.counter("corrupt") == 0  # counters are independent

    def test_concurrent_updates_lose_none(self, db, db_url):
        threads, each = 4, 100

        def add(k: int) -> list[int]:
            mine = connect(db_url, db.prefix, retry_for=30)
            try:
                return [mine.add_to_counter("updates", 1) for _ in range(each)]
            finally:
                mine.close()

        totals = [t for r in in_threads(threads, add) for t in r]
        assert db.counter("updates") == threads * each
        assert sorted(totals) == list(range(1, threads * each + 1))  # each increment saw its own total


class TestStopRequests:
    def test_a_stop_request_survives_a_clear_until_the_worker_leaves(self, db):
        assert not db.stop_requested("w1")
        db.heartbeat("w1", beat("w1"), ttl=60)
        db.request_stop("w1")
        assert db.stop_requested("w1") and not db.stop_requested("w2")
        db.clear(sessions=True, params=True, workers=True, metrics=True)
        assert db.stop_requested("w1"), "clear deleted a stop request that a remote worker has not seen"
        db.remove_worker("w1")
        assert not db.stop_requested("w1")

    def test_a_stop_request_expires(self, db, monkeypatch):
        monkeypatch.setattr(control, "STOP_TTL", 0.3)
        db.request_stop("gone")
        assert db.stop_requested("gone")
        wait_for(lambda: not db.stop_requested("gone"), 20, "the stop request to expire")


def raw_params(db, data: bytes) -> None:
    """Overwrite the stored params record past the encoder."""
    if is_sqlite(db):
        conn = sqlite3.connect(db.path, timeout=30)
        with conn:
            assert conn.execute(f'UPDATE "{db.prefix}:params" SET data = ?', (data,)).rowcount == 1
        conn.close()
    else:
        r = redis.Redis.from_url(db.url)
        assert r.hset(f"{db.prefix}:params", "data", data) == 0
        r.close()


class TestParams:
    def test_none_before_the_first_save(self, db):
        assert db.params_version() is None
        assert db.load_params() is None

    def test_version_only_grows(self, db):
        assert db.save_params(params_of(1)) == 1
        assert db.save_params(params_of(2)) == 2
        assert db.params_version() == 2
        assert db.save_params(params_of(3), min_version=10) == 10
        assert db.save_params(params_of(4), min_version=3) == 11  # a lower min_version never goes back
        assert db.save_params(params_of(5)) == 12
        version, params = db.load_params()
        assert version == 12 == db.params_version()
        np.testing.assert_array_equal(params["w"], params_of(5)["w"])

    def test_if_absent_never_overwrites(self, db):
        assert db.save_params(params_of(7), if_absent=True) == 1
        assert db.save_params(params_of(8), if_absent=True) is None
        assert db.save_params(params_of(9), min_version=50, if_absent=True) is None
        version, params = db.load_params()
        assert version == 1 and int(params["steps"]) == 7

    def test_expect_writes_only_over_that_version(self, db):
        assert db.save_params(params_of(1), expect=3) is None  # none stored: version 0 is expected
        assert db.params_version() is None
        assert db.save_params(params_of(1), expect=0) == 1
        assert db.save_params(params_of(2), expect=0) is None  # lost the race: nothing written
        assert db.save_params(params_of(3), expect=1) == 2
        assert db.save_params(params_of(4), expect=2, min_version=9) == 9
        version, params = db.load_params()
        assert version == 9 and int(params["steps"]) == 4

    def test_load_returns_exactly_what_was_saved(self, db):
        rng = np.random.default_rng(3)
        saved = {
            "q.weight": rng.standard_normal((64, 32)).astype(np.float32),
            "q.bias": rng.standard_normal(32),
            "half": rng.standard_normal(5).astype(np.float16),
            "counts": rng.integers(-(2**40), 2**40, 9),
            "mask": rng.random(11) > 0.5,
            "frames": np.tile(np.arange(84, dtype=np.uint8), (4, 84, 1)),  # compressible uint8
            "noise": rng.integers(0, 256, 5000, dtype=np.uint8),
            "scalar": np.array(0.25, np.float32),
            "step": np.array(12345, np.int64),
            "empty": np.zeros((0, 3), np.float32),
        }
        db.save_params(saved)
        version, loaded = db.load_params()
        assert version == 1
        assert set(loaded) == set(saved)
        for k, v in saved.items():
            assert loaded[k].dtype == v.dtype and loaded[k].shape == v.shape, k
            np.testing.assert_array_equal(loaded[k], v, err_msg=k)
        assert loaded["frames"].dtype == np.uint8
        assert all(v.flags.writeable for v in loaded.values())  # set_params may load them in place

    @pytest.mark.parametrize("damage", ["truncate", "garbage"])
    def test_corrupt_params_name_themselves_and_the_fix(self, db, damage):
        db.save_params(params_of(1))
        db.save_params(params_of(2))
        blob = encode(params_of(2))
        raw_params(db, blob[:-10] if damage == "truncate" else b"not params at all")
        with pytest.raises(RecordError) as info:
            db.load_params()
        message = str(info.value)
        assert "stored params" in message and db.prefix in message and "clear --del-params" in message
        assert "corrupt or foreign record" in message and "\n" not in message
        assert db.params_version() == 2  # the version is still readable: info can show it
        assert db.save_params(params_of(3)) == 3  # and a new publish replaces the damage
        version, loaded = db.load_params()
        assert version == 3 and int(loaded["steps"]) == 3


class TestWorkers:
    def test_heartbeat_list_replace_remove(self, db):
        assert db.workers() == []
        db.heartbeat("p1", beat("p1", sessions=1), ttl=60)
        db.heartbeat("t1", beat("t1", role="trainer", steps=0), ttl=60)
        db.heartbeat("p1", beat("p1", sessions=2), ttl=60)  # replaces, not adds
        got = sorted(db.workers(), key=lambda w: w["id"])
        assert got == [beat("p1", sessions=2), beat("t1", role="trainer", steps=0)]
        db.remove_worker("p1")
        assert [w["id"] for w in db.workers()] == ["t1"]
        db.remove_worker("never-there")
        assert [w["id"] for w in db.workers()] == ["t1"]

    def test_heartbeats_expire(self, db):
        db.heartbeat("short", beat("short"), ttl=0.3)
        db.heartbeat("long", beat("long"), ttl=120)
        wait_for(lambda: [w["id"] for w in db.workers()] == ["long"], 20, "the short heartbeat to expire")
        db.heartbeat("short", beat("short"), ttl=120)  # a worker that comes back is listed again
        assert sorted(w["id"] for w in db.workers()) == ["long", "short"]


class TestMetrics:
    def test_ordered_per_kind(self, db):
        assert db.metrics("episodes") == []
        db.add_metrics("episodes", [episode(float(i)) for i in range(5)])
        db.add_metrics("train", [{"loss": 0.5}])
        db.add_metrics("episodes", [episode(5.0)])
        db.add_metrics("episodes", [])
        assert [m["return"] for m in db.metrics("episodes")] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        assert [m["return"] for m in db.metrics("episodes", 2)] == [4.0, 5.0]
        assert db.metrics("train") == [{"loss": 0.5}]
        assert db.metrics("other") == []

    def test_asking_for_none_gets_none(self, db):
        db.add_metrics("episodes", [episode(1.0), episode(2.0)])
        assert db.metrics("episodes", 0) == []

    def test_bounded(self, db, monkeypatch):
        monkeypatch.setattr(control, "METRICS_LIMIT", 10)  # the real limit, made small enough to reach
        for start in range(0, 25, 5):
            db.add_metrics("episodes", [episode(1.0, n=i) for i in range(start, start + 5)])
        db.add_metrics("train", [{"n": -1}])
        assert [m["n"] for m in db.metrics("episodes")] == list(range(15, 25))
        db.add_metrics("episodes", [episode(1.0, n=i) for i in range(25, 60)])  # one call far past the limit
        assert [m["n"] for m in db.metrics("episodes")] == list(range(50, 60))
        assert db.metrics("train") == [{"n": -1}]


PARTS = ["sessions", "params", "workers", "metrics"]


def fill(db) -> None:
    db.add_sessions([tiny(i) for i in range(3)], capacity=BIG)
    db.save_params(params_of(1))
    db.heartbeat("w", beat("w"), ttl=60)
    db.add_metrics("episodes", [episode(1.0)])


def present(db) -> dict[str, bool]:
    """Which parts that :func:`fill` stored are there (ids 1..9 hold its sessions, after any removed junk)."""
    return {
        "sessions": markers(db.get_batch(range(1, 10))) == [0, 1, 2] and size(db.sample_batch(2)) == 2,
        "params": db.params_version() == 1 and db.load_params() is not None,
        "workers": db.workers() == [beat("w")],
        "metrics": db.metrics("episodes") == [episode(1.0)],
    }


def settle(db) -> dict:
    """Store every kind of setting and counter (before :func:`fill`); return what was stored."""
    db.set_capacity(50)
    db.claim("options", {"lr": 0.1})
    db.claim("layout", layout(tiny(0)))
    db.add_to_counter("updates", 5)
    raw_insert(db, b"junk")  # id 1, before any session: removed when met, and counted
    assert db.get_batch([1]) == {}
    db.request_stop("w")
    return {"capacity": 50, "options": {"lr": 0.1}, "layout": layout(tiny(0)), "updates": 5, "corrupt": 1}


def settings(db) -> dict:
    return {
        "capacity": db.capacity(),
        "options": db.setting("options"),
        "layout": db.setting("layout"),
        "updates": db.counter("updates"),
        "corrupt": db.counter("corrupt"),
    }


class TestClear:
    @pytest.mark.parametrize("part", PARTS)
    def test_clear_one_part_leaves_the_others(self, db, part):
        stored = settle(db)
        fill(db)
        db.clear(**{part: True})
        assert present(db) == {p: p != part for p in PARTS}
        # clearing sessions forgets their layout, and no other setting
        assert settings(db) == {**stored, "layout": None if part == "sessions" else stored["layout"]}
        assert db.stop_requested("w")

    def test_clear_nothing_and_everything(self, db):
        stored = settle(db)
        fill(db)
        db.clear()
        assert all(present(db).values()) and settings(db) == stored
        db.clear(sessions=True, params=True, workers=True, metrics=True)
        assert not any(present(db).values())
        assert db.sample_batch(3) == {} and db.load_params() is None
        assert settings(db) == {"capacity": None, "options": None, "layout": None, "updates": 0, "corrupt": 0}
        assert db.stop_requested("w")
        db.add_sessions([tiny(i) for i in range(60)], capacity=7)  # the next run stores its own capacity
        assert db.capacity() == 7 and db.count_sessions() == (7, 60)

    def test_sessions_after_a_clear(self, db):
        db.add_sessions([tiny(i) for i in range(5)], capacity=4)
        db.clear(sessions=True)
        assert db.count_sessions() == (0, 5)  # stored now, ever added
        assert db.sample_batch(4) == {}
        db.add_sessions([tiny(i) for i in range(5, 11)], capacity=4)
        assert db.count_sessions() == (4, 11)
        assert set(markers(db.sample_batch(200))) == {7, 8, 9, 10}


class TestNamespaces:
    def test_two_prefixes_do_not_see_each_other(self, db, db_url):
        other_prefix = f"test-{uuid.uuid4().hex[:10]}"
        other = connect(db_url, other_prefix, retry_for=5)
        try:
            fill(db)
            db.claim("options", {"lr": 0.1})
            db.add_to_counter("updates", 3)
            assert other.count_sessions() == (0, 0) and other.sample_batch(3) == {}
            assert other.params_version() is None and other.workers() == [] and other.metrics("episodes") == []
            assert other.setting("options") is None and other.counter("updates") == 0
            other.add_sessions([tiny(100)], capacity=1)
            other.save_params(params_of(1), min_version=40)
            other.claim("options", {"lr": 0.5})
            assert markers(other.sample_batch(3)) == [100, 100, 100]
            assert all(present(db).values()) and db.capacity() == BIG and db.setting("options") == {"lr": 0.1}

            assert {db.prefix, other_prefix} <= set(db.namespaces())
            assert db.namespaces() == sorted(db.namespaces())

            other.clear(sessions=True, params=True, workers=True, metrics=True)
            assert all(present(db).values()) and db.setting("options") == {"lr": 0.1} and db.counter("updates") == 3
        finally:
            other.clear(sessions=True, params=True, workers=True, metrics=True)
            other.close()

    def test_clearing_everything_forgets_the_namespace_and_its_counter(self, db_url, prefix):
        db = connect(db_url, prefix, retry_for=5)
        db.add_sessions([tiny(1), tiny(2)], capacity=5)
        db.save_params(params_of(1))
        assert prefix in db.namespaces() and db.count_sessions() == (2, 2)
        db.clear(sessions=True, params=True, workers=True, metrics=True)
        assert db.count_sessions() == (0, 0) and db.capacity() is None
        if db_url.startswith("redis"):  # SQLite lists a namespace while its tables exist
            assert prefix not in db.namespaces()
        db.add_sessions([tiny(3)], capacity=5)  # an append registers it again
        assert prefix in db.namespaces() and db.count_sessions() == (1, 1)
        db.clear(sessions=True, params=True, workers=True, metrics=True)
        db.close()

    @pytest.mark.parametrize("bad", ["", "a:b", "a b", "x*", "é", "a" * 65])
    def test_bad_prefix(self, db_url, bad):
        with pytest.raises(DatabaseError, match="bad prefix"):
            connect(db_url, bad, retry_for=1)


class TestConcurrency:
    @pytest.mark.parametrize("capacity", [BIG, 64])
    def test_concurrent_writer_processes_lose_nothing(self, db, db_url, capacity, tmp_path):
        writers, per_writer, gate = 4, 200, tmp_path / "gate"
        total = writers * per_writer
        procs = [start(WRITE_SESSIONS, db_url, db.prefix, w, per_writer, capacity, gate) for w in range(writers)]
        sampled, last_added, added_at_gate = 0, 0, None
        while any(p.poll() is None for p in procs):  # read while they write
            stored, added = db.count_sessions()
            assert added >= last_added and stored <= min(added, capacity)
            last_added = added
            batch = db.sample_batch(16)
            assert size(batch) == 16 if stored else size(batch) in (0, 16)  # more may be stored by now
            assert all(0 <= w < writers and 0 <= i < per_writer for w, i in check_batch(batch))
            sampled += size(batch)
            if sampled >= 64 and added_at_gate is None:  # the writers wait halfway until the reader has read
                added_at_gate = db.count_sessions()[1]
                gate.touch()
        join_all(procs)
        assert added_at_gate is not None and added_at_gate <= total // 2, "the reader read while they wrote"
        assert db.count_sessions() == (min(total, capacity), total)
        records = raw_records(db)
        assert [i for i, _ in records] == list(range(total - min(total, capacity) + 1, total + 1))
        seen = [check_session(decode(data), sampled=False) for _, data in records]
        if capacity >= total:
            assert sorted(seen) == [(w, i) for w in range(writers) for i in range(per_writer)]
        assert db.counter("corrupt") == 0
        assert size(db.sample_batch(64)) == 64 and len(check_batch(db.sample_batch(64))) == 64

    def test_sampled_ids_are_stored_ones_while_a_writer_evicts(self, db, db_url):
        writer = start(WRITE_SESSIONS, db_url, db.prefix, 1, 1000, 30)
        batches = 0
        while writer.poll() is None or batches < 20:
            lo = db.session_range()[0]  # the oldest stored id only grows
            batch = db.sample_batch(16)
            hi = db.session_range()[1]
            if batch:
                assert lo <= batch["id"].min() and batch["id"].max() <= hi, (lo, hi, batch["id"])
                assert [i + 1 for _, i in check_batch(batch)] == batch["id"].tolist()
                batches += 1
        join_all([writer])
        assert batches >= 20 and db.count_sessions() == (30, 1000)

    def test_a_reader_never_sees_half_written_params(self, db, db_url, tmp_path):
        stop = tmp_path / "stop"
        writer = start(PUBLISH_PARAMS, db_url, db.prefix, stop)
        seen, last = set(), 0
        try:
            deadline = time.monotonic() + 60
            while len(seen) < 25 and writer.poll() is None and time.monotonic() < deadline:
                found = db.load_params()
                if found is None:
                    continue
                version, params = found
                assert version >= last, "the version went back"
                for k, v in params_of(version).items():
                    np.testing.assert_array_equal(params[k], v, err_msg=f"{k} of version {version}")
                seen.add(version)
                last = version
                assert (db.params_version() or 0) >= version
        finally:
            stop.touch()
            join_all([writer])
        assert len(seen) >= 25, f"saw only versions {sorted(seen)}"

    def test_clearing_sessions_while_a_writer_appends(self, db, db_url):
        writer = start(WRITE_SESSIONS, db_url, db.prefix, 1, 300, BIG)
        clears = 0
        while writer.poll() is None:
            db.clear(sessions=True)
            clears += 1
            lo, hi = db.session_range()  # every id in the range is stored, whatever was appended meanwhile
            assert size(db.get_batch(range(lo, hi + 1))) == max(hi - lo + 1, 0), f"after clear {clears}"
        join_all([writer])
        stored, added = db.count_sessions()
        records = raw_records(db)
        assert added == 300 and stored == len(records), f"count says {stored}, {len(records)} stored"
        assert [i for i, _ in records] == list(range(added - stored + 1, added + 1))
        assert size(db.sample_batch(32)) == (32 if stored else 0)
        assert clears > 0 and db.counter("corrupt") == 0

    def test_writers_killed_mid_stream_leave_no_damage(self, db, db_url, tmp_path):
        sessions = start(WRITE_SESSIONS, db_url, db.prefix, 3, BIG, BIG)
        params = start(PUBLISH_PARAMS, db_url, db.prefix, tmp_path / "never")
        try:
            wait_for(lambda: db.count_sessions()[1] >= 100 and (db.params_version() or 0) >= 10, 20, "both writers")
        finally:
            for p in (sessions, params):
                p.kill()  # SIGKILL, mid-write as likely as not
                p.wait()
                p.stderr.close()
        stored, added = db.count_sessions()
        records = raw_records(db)
        assert stored == added == len(records) >= 100
        assert [i for i, _ in records] == list(range(1, added + 1))
        assert sorted(check_session(decode(data), sampled=False) for _, data in records) == [
            (3, i) for i in range(added)
        ]
        version, loaded = db.load_params()
        assert version >= 10
        for k, v in params_of(version).items():
            np.testing.assert_array_equal(loaded[k], v, err_msg=k)
        assert db.save_params(params_of(version + 1)) == version + 1  # and writing goes on


# -- bounded work per sample, checked without timing --------------------------------


def test_sqlite_sample_and_count_do_the_same_work_at_any_size(tmp_path, prefix):
    """Count SQLite virtual-machine steps: a scan of the table would grow with it."""
    db = connect(f"sqlite:///{tmp_path / 'big.db'}", prefix, retry_for=5)
    steps = [0]

    def tick():
        steps[0] += 1
        return 0

    def work(fn) -> int:
        db.conn.set_progress_handler(tick, 10)  # one tick per 10 instructions
        steps[0] = 0
        try:
            fn()
        finally:
            db.conn.set_progress_handler(None, 10)
        return steps[0]

    db.add_sessions([tiny(i) for i in range(1_000)], capacity=BIG)
    small = [work(lambda: db.sample_batch(64)), work(db.count_sessions)]
    for begin in range(1_000, 20_000, 1_900):
        db.add_sessions([tiny(i) for i in range(begin, begin + 1_900)], capacity=BIG)
    large = [work(lambda: db.sample_batch(64)), work(db.count_sessions)]
    assert db.count_sessions() == (20_000, 20_000)
    for s, b in zip(small, large, strict=True):
        assert b <= 2 * s + 20, (small, large)
        assert b * 10 < 20_000, "fewer instructions than rows: nothing scans the table"
    db.close()


def test_redis_sample_and_count_use_only_bounded_commands(redis_server, prefix):
    """On a private server, list the commands a sample issues (scripts' inner calls included).

    Only commands whose cost does not depend on how much is stored are allowed,
    about one per session drawn, and exactly the same ones at 1,000 and 20,000.
    """
    db = connect(redis_server.url, prefix, retry_for=5)
    admin = redis.Redis.from_url(redis_server.url)

    def commands(fn) -> dict[str, int]:
        admin.config_resetstat()
        fn()
        stats = admin.info("commandstats")
        return {k.removeprefix("cmdstat_"): v["calls"] for k, v in stats.items() if not k.startswith("cmdstat_config")}

    def fill(upto: int) -> None:
        stored = db.count_sessions()[1]
        for begin in range(stored, upto, 2_000):
            db.add_sessions([tiny(i) for i in range(begin, min(begin + 2_000, upto))], capacity=BIG)

    bounded = {"get", "mget", "hget", "hmget", "exists", "hexists", "evalsha", "eval"}
    db.add_sessions([tiny(0)], capacity=BIG)
    db.sample_batch(1)  # loads any script once, so that only the steady state is counted
    seen = {}
    for stored in (1_000, 20_000):
        fill(stored)
        db.sample_batch(1)  # the first call loads any Lua script into the server
        seen[stored] = [commands(lambda: db.sample_batch(64)), commands(db.count_sessions)]
        for calls in seen[stored]:
            assert set(calls) <= bounded, calls
        assert sum(seen[stored][0].values()) <= 64 + 4 and sum(seen[stored][1].values()) <= 3
    assert seen[1_000] == seen[20_000]
    assert db.count_sessions() == (20_000, 20_000)
    admin.close()
    db.close()


# -- bad URLs and servers that go away -------------------------------------------------


def closed_port() -> int:
    from conftest import free_port

    return free_port()


def test_a_backend_missing_a_primitive_cannot_be_made(tmp_path):
    primitives = sorted(Database.__abstractmethods__)
    assert len(primitives) == 18 and "_add" in primitives and "_namespaces" in primitives
    assert not SQLiteDatabase.__abstractmethods__ and not RedisDatabase.__abstractmethods__
    for missing in primitives:  # each of the others as SQLite has it: the one left out is named
        partial = type("Partial", (Database,), {p: getattr(SQLiteDatabase, p) for p in primitives if p != missing})
        with pytest.raises(TypeError, match=f"abstract .*{missing}"):
            partial(f"sqlite:///{tmp_path / 'partial.db'}", "partial")
    assert not (tmp_path / "partial.db").exists(), "refused before it opened anything"


@pytest.mark.parametrize("url", ["mysql://localhost/x", "localhost:6379", "postgres://u@h/db", "file.db"])
def test_bad_url_scheme(url):
    with pytest.raises(DatabaseError, match="unknown database URL") as info:
        connect(url, "p", retry_for=1)
    assert "sqlite:///" in str(info.value) and "redis://" in str(info.value)


def test_unreachable_redis_gives_one_clear_line():
    url = f"redis://127.0.0.1:{closed_port()}/0"
    with pytest.raises(DatabaseError) as info:
        connect(url, "p", retry_for=1)
    message = str(info.value)
    assert url in message and "start the server" in message and "\n" not in message
    assert info.value.__cause__ is None and info.value.__suppress_context__


def test_sqlite_without_create_needs_an_existing_file(tmp_path, prefix):
    path = tmp_path / "missing.db"
    with pytest.raises(DatabaseError, match="no SQLite database at .*missing.db"):
        connect(f"sqlite:///{path}", prefix, retry_for=1, create=False)
    assert not path.exists() and list(tmp_path.iterdir()) == []  # not even an empty file or a journal
    made = connect(f"sqlite:///{path}", prefix, retry_for=1)  # create=True (the default) makes it
    made.add_sessions([tiny(7)], capacity=BIG)
    made.close()
    found = connect(f"sqlite:///{path}", prefix, retry_for=1, create=False)
    assert markers(found.get_batch([1])) == [7]
    found.close()


def _open_at_once(path, barrier, results):
    barrier.wait()
    try:
        connect(f"sqlite:///{path}", "p", retry_for=1).close()
        results.put("ok")
    except DatabaseError as e:
        results.put(str(e))


def test_sqlite_new_file_opened_by_several_processes_at_once(tmp_path):
    # `play &` and `train &` on a new file: making it WAL, all but one are refused at once, not made to wait
    # (before the fix, 2 processes failed in 90 of 200 tries with "database is locked")
    context = multiprocessing.get_context("fork")
    for trial in range(10):
        barrier, results = context.Barrier(3), context.Queue()
        procs = [
            context.Process(target=_open_at_once, args=(tmp_path / f"{trial}.db", barrier, results)) for _ in "abc"
        ]
        for p in procs:
            p.start()
        outcomes = [results.get(timeout=60) for _ in procs]
        for p in procs:
            p.join()
        assert outcomes == ["ok"] * 3, outcomes


def test_sqlite_in_a_missing_folder(tmp_path):
    with pytest.raises(DatabaseError, match="--db"):
        connect(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}", "p", retry_for=1)


def test_sqlite_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database" * 100)
    with pytest.raises(DatabaseError, match="notes.db"):
        connect(f"sqlite:///{path}", "p", retry_for=1)
    assert path.read_bytes().startswith(b"these are my notes")  # and it is left alone


def test_masked_urls():
    assert masked("redis://:secret@host:6379/0") == "redis://:***@host:6379/0"
    assert masked("redis://user:secret@host:6379/0") == "redis://user:***@host:6379/0"
    assert masked("redis://host:6379/0") == "redis://host:6379/0"
    assert masked("sqlite:///tmp/x.db") == "sqlite:///tmp/x.db"
    with pytest.raises(DatabaseError, match="unknown database URL") as info:
        connect("mysql://user:secret@host/x", "p", retry_for=1)
    assert "secret" not in str(info.value) and "***" in str(info.value)


def test_a_redis_password_never_shows(locked_redis, prefix, caplog):
    url = f"redis://:secret@127.0.0.1:{locked_redis.port}/0"
    db = connect(url, prefix, retry_for=1)
    assert db.url == f"redis://:***@127.0.0.1:{locked_redis.port}/0"
    db.add_sessions([tiny(5)], capacity=BIG)  # the password itself works
    assert markers(db.sample_batch(2)) == [5, 5]
    locked_redis.stop()
    with caplog.at_level(logging.WARNING, logger="tinyverse"):
        with pytest.raises(DatabaseError, match="cannot reach") as info:
            db.count_sessions()
    assert "***" in str(info.value)
    assert "secret" not in str(info.value) + caplog.text + repr(vars(db).get("url"))
    db.close()


@pytest.mark.parametrize("password", ["wrong", None])
def test_a_wrong_redis_password_fails_at_once(locked_redis, prefix, caplog, password):
    auth = "" if password is None else f":{password}@"
    url = f"redis://{auth}127.0.0.1:{locked_redis.port}/0"
    outcome = {}

    def run():
        try:
            connect(url, prefix, retry_for=None)  # waits for ever for a server that is down: not for this
        except Exception as e:
            outcome["error"] = e

    with caplog.at_level(logging.WARNING, logger="tinyverse"):
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        thread.join(30)  # a hang guard only: a retried refusal would never end
        assert not thread.is_alive(), "a refused password was retried"
    error = outcome.get("error")
    assert isinstance(error, DatabaseError), repr(error)
    assert "password" in str(error) and "\n" not in str(error)
    if password:
        assert password not in str(error) and "***" in str(error)
    assert not warnings_about(caplog, "unreachable")  # refused, not waited out


def test_redis_restart_is_waited_out(redis_server, prefix, caplog):
    db = connect(redis_server.url, prefix, retry_for=None)  # as players and trainers run: wait for ever
    db.add_sessions([make_session(1)], capacity=BIG)
    db.save_params(params_of(1))
    redis_server.stop()

    result: dict = {}

    def use():
        try:
            db.add_sessions([make_session(2)], capacity=BIG)
            result["sample"] = db.sample_batch(8)
            result["count"] = db.count_sessions()
        except Exception as e:  # surfaced to the test below
            result["error"] = e

    with caplog.at_level(logging.WARNING, logger="tinyverse"):
        thread = threading.Thread(target=use, daemon=True)
        thread.start()
        wait_for(lambda: "unreachable" in caplog.text, 20, "the client to report the outage")
        assert thread.is_alive(), "the client waits while the server is down"
        redis_server.start()
        thread.join(60)
        assert not thread.is_alive(), "the client carried on once the server was back"
    assert "error" not in result, result.get("error")
    assert "is back" in caplog.text
    # the private server keeps nothing across a restart; what was written after it is there
    # (a retried append may apply twice: the contract allows duplicates, never damage)
    assert 1 <= result["count"][0] <= 2
    assert check_batch(result["sample"]) == [(0, 2)] * 8
    assert db.load_params() is None
    db.save_params(params_of(1))
    assert db.params_version() == 1

    # with a bound on the wait, a server that stays down is one clear error
    redis_server.stop()
    db.retry_for = 1
    with pytest.raises(DatabaseError, match="cannot reach database"):
        db.count_sessions()
    db.close()


# -- junk: any machine that can write to the database may have written anything ---------------------------------------


def raw(db):
    """The backend's own client on the test's database: sqlite3 or redis-py, as a foreign writer has."""
    return sqlite3.connect(db.path, timeout=30, isolation_level=None) if is_sqlite(db) else redis.Redis.from_url(db.url)


def raw_meta(db, key: str, value) -> None:
    """Store a setting, counter or stop request past the database's checks."""
    client = raw(db)
    if is_sqlite(db):
        client.execute(f'INSERT OR REPLACE INTO "{db.prefix}:meta" VALUES (?, ?)', (key, value))
    else:
        client.hset(f"{db.prefix}:meta", key, value)
    client.close()


def raw_fields(db, **fields) -> None:
    """Overwrite fields of the stored params (version, time) past the database's checks."""
    client = raw(db)
    for name, value in fields.items():
        if is_sqlite(db):
            client.execute(f'UPDATE "{db.prefix}:params" SET {name} = ?', (value,))
        else:
            client.hset(f"{db.prefix}:params", name, value)
    client.close()


def raw_beats(db, beats: dict) -> None:
    """Store heartbeats (text of any kind) under worker ids, for a minute."""
    client = raw(db)
    for worker_id, text in beats.items():
        if is_sqlite(db):
            client.execute(f'INSERT INTO "{db.prefix}:workers" VALUES (?, ?, ?)', (worker_id, text, time.time() + 60))
        else:
            client.set(f"{db.prefix}:worker:{worker_id}", text, ex=60)
    client.close()


def raw_metrics(db, kind: str, texts: list) -> None:
    client = raw(db)
    for text in texts:
        if is_sqlite(db):
            client.execute(f'INSERT INTO "{db.prefix}:metrics" (kind, data) VALUES (?, ?)', (kind, text))
        else:
            client.rpush(f"{db.prefix}:metrics:{kind}", text)
    client.close()


def one_line(error: Exception, *names: str) -> str:
    """The message of ``error``: one line, naming each of ``names``."""
    message = str(error)
    assert "\n" not in message and all(n in message for n in names), message
    return message


NESTED = "[" * 100_000 + "]" * 100_000  # json.loads's recursion error
SETTINGS = [  # key, junk stored as its text, the method that reads it
    ("capacity", "abc", "capacity"),
    ("capacity", "0", "capacity"),
    ("capacity", "-3", "capacity"),
    ("capacity", "1.5", "capacity"),
    ("capacity", '"7"', "capacity"),
    ("capacity", str(2**63), "capacity"),
    ("updates", "true", "counter"),
    ("updates", "NaN", "counter"),
    ("corrupt", "[1]", "counter"),
    ("options", "[1, 2]", "setting"),
    ("options", '"lr=0.1"', "setting"),
    ("options", NESTED, "setting"),
    ("options", "{" + " " * 2**20 + "}", "setting"),  # bigger than any setting tinyverse stores
    ("defaults", "3", "setting"),
    ("layout", "5", "setting"),
    ("layout", '[["a", "|O", [1]]]', "setting"),
    ("layout", '[["a", "<f8", [-1]]]', "setting"),
    ("layout", '[["a", "<f8", [1073741824]]]', "setting"),  # 8 GiB a session
    ("layout", '[["a", "<f8"]]', "setting"),
    ("layout", "{", "setting"),
]


class TestJunk:
    @pytest.mark.parametrize(("key", "junk", "reader"), SETTINGS, ids=[f"{k}-{j[:12]}" for k, j, _ in SETTINGS])
    def test_a_junk_setting_is_one_line_naming_it_and_the_fix(self, db, key, junk, reader):
        raw_meta(db, key, junk)
        with pytest.raises(DatabaseError) as info:
            {"capacity": db.capacity, "counter": lambda: db.counter(key), "setting": lambda: db.setting(key)}[reader]()
        one_line(info.value, f"setting {key!r} of prefix {db.prefix}", "clear --all")
        db.clear(sessions=True, params=True, workers=True, metrics=True)  # clear --all deletes it
        assert db.setting(key) is None

    def test_a_junk_layout_refuses_a_player_and_a_trainer_in_one_line(self, db):
        raw_meta(db, "layout", '[["i", "not a dtype", []]]')
        for use in (lambda: db.add_sessions([tiny(1)], capacity=BIG), lambda: db.sample_batch(2)):
            raw_add(db, [tiny(0)])
            with pytest.raises(DatabaseError) as info:
                use()
            one_line(info.value, "setting 'layout'", "clear --all")

    @pytest.mark.parametrize("junk", ["abc", "0", "-5", "1.5", "1e300"])
    def test_a_junk_capacity_evicts_nothing_and_writes_nothing(self, db, junk):
        db.add_sessions([tiny(i) for i in range(4)], capacity=BIG)
        raw_meta(db, "capacity", junk)
        with pytest.raises(DatabaseError) as info:
            db.add_sessions([tiny(9)])
        one_line(info.value, "capacity", "clear --all")
        assert db.count_sessions() == (4, 4) and sorted(markers(db.get_batch(range(1, 9)))) == [0, 1, 2, 3]

    def test_a_counter_set_far_ahead_costs_an_append_no_more_than_its_sessions(self, db):
        db.add_sessions([tiny(i) for i in range(3)], capacity=5)
        if is_sqlite(db):  # the ids handed out, set by hand far ahead: eviction must not walk the gap
            client = raw(db)
            client.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (10**15, f"{db.prefix}:sessions"))
            client.close()
        else:
            raw(db).set(f"{db.prefix}:seq", 10**15)
        db.add_sessions([tiny(i) for i in range(10, 13)])
        assert db.count_sessions().added == 10**15 + 3
        assert set(markers(db.sample_batch(50))) == {10, 11, 12}
        assert sorted(i for i, _ in raw_records(db)) == [10**15 + 1, 10**15 + 2, 10**15 + 3]

    @pytest.mark.parametrize("junk", ["abc", "-1", str(2**60), "1.5"])
    def test_a_junk_count_of_sessions_is_one_line(self, db, junk):
        db.add_sessions([tiny(1)], capacity=5)
        if is_sqlite(db):
            client = raw(db)
            client.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = ?", (junk, f"{db.prefix}:sessions"))
            client.close()
        else:
            raw(db).set(f"{db.prefix}:seq", junk)
        with pytest.raises(DatabaseError) as info:
            db.count_sessions()
        one_line(info.value, "clear --all")
        db.clear(sessions=True, params=True, workers=True, metrics=True)
        assert db.count_sessions() == (0, 0)

    @pytest.mark.parametrize("field", ["version", "time"])
    @pytest.mark.parametrize("junk", ["abc", "-1", str(2**64), "1.5e400", "nan"])
    def test_a_junk_params_version_or_time_is_one_line(self, db, field, junk):
        if field == "version" and junk == "nan":
            junk = "1.5"
        db.save_params(params_of(1))
        raw_fields(db, **{field: junk})
        uses = [db.params_version, db.load_params] + [lambda: db.save_params(params_of(2))] * (field == "version")
        for use in uses:  # a save reads the version only: it replaces a junk time
            with pytest.raises(DatabaseError) as info:
                use()
            one_line(info.value, f"the stored params of {db.prefix}' {field}", "clear --del-params")
        db.clear(params=True)
        assert db.params_version() is None and db.save_params(params_of(2)) == 1

    @pytest.mark.parametrize("junk", ["abc", "nan", "[1]", "-5"])
    def test_a_junk_stop_request_is_one_line_and_goes_with_its_worker(self, db, junk):
        raw_meta(db, "stop:w1", junk)
        with pytest.raises(DatabaseError) as info:
            db.stop_requested("w1")
        one_line(info.value, "stop request of worker 'w1'")
        db.remove_worker("w1")
        assert not db.stop_requested("w1")

    def test_a_junk_counter_is_one_line_when_added_to(self, db):
        raw_meta(db, "updates", "abc" if not is_sqlite(db) else "1e300")
        with pytest.raises(DatabaseError) as info:
            db.add_to_counter("updates", 1)
        one_line(info.value, "updates", "clear --all")

    @pytest.mark.parametrize(
        ("key", "value"),
        [("layout", [["a", "|O", [1]]]), ("layout", 5), ("capacity", "x"), ("capacity", 0), ("options", [1])],
    )
    def test_claims_are_checked_before_they_are_stored(self, db, key, value):
        with pytest.raises(DatabaseError, match="nothing was stored"):
            db.claim(key, value)
        assert db.setting(key) is None

    @pytest.mark.parametrize("capacity", [-5, 1.5, "7", 2**60])
    def test_an_appends_capacity_is_checked_before_it_is_stored(self, db, capacity):
        with pytest.raises(DatabaseError, match="^buffer size is .*: nothing was stored$"):
            db.add_sessions([tiny(1)], capacity=capacity)
        assert db.capacity() is None and db.count_sessions() == (0, 0)

    def test_malformed_heartbeats_are_skipped_with_a_warning_now_and_then(self, db, caplog):
        pace = {"updates_per_step": None, "learning_starts": 0, "pace_slack": 10, "session_length": 8}
        db.heartbeat("good", beat("good", pace=pace, waiting=None))
        bad = {
            "a": "not json",
            "b": "[1, 2]",
            "c": json.dumps({**beat("c"), "role": 5}),
            "d": json.dumps({k: v for k, v in beat("d").items() if k != "host"}),
            "e": json.dumps({**beat("e"), "pid": "7"}),
            "f": json.dumps({**beat("f"), "started": "yesterday"}),
            "g": json.dumps({**beat("g"), "started": float("nan")}),
            "h": json.dumps({**beat("h"), "host": "box\x1b[2J"}),
            "i": json.dumps({**beat("i"), "pace": {"session_length": "8"}}),
            "j": json.dumps({**beat("j"), "pushes": True}),
            "k": json.dumps({**beat("k"), "steps_per_s": 10**300}),
            "l": "9" * 5000,
        }
        raw_beats(db, bad)
        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            for _ in range(3):
                assert [w["id"] for w in db.workers()] == ["good"]
        (said,) = warnings_about(caplog, "malformed heartbeats")
        assert f"skipped {len(bad)} malformed heartbeats in {db.prefix}" in said
        db.clear(sessions=True, params=True, workers=True, metrics=True)
        assert db.workers() == [] and (is_sqlite(db) or not list(raw(db).scan_iter(f"{db.prefix}:worker:*")))

    def test_a_heartbeats_id_is_its_key(self, db):
        raw_beats(db, {"w1": json.dumps({**beat("w1"), "id": ["not", "this"]})})
        assert [w["id"] for w in db.workers()] == ["w1"]
        db.remove_worker(db.workers()[0]["id"])
        assert db.workers() == []

    def test_malformed_metrics_are_skipped_with_a_warning_now_and_then(self, db, caplog):
        db.add_metrics("episodes", [episode(1.0)])
        raw_metrics(db, "episodes", ["not json", "[]", '{"return": "10", "time": 1}', '{"return": 1.0}'])
        raw_metrics(db, "episodes", ['{"return": Infinity, "time": 1}', '{"return": 1, "time": 1, "steps": "x"}'])
        db.add_metrics("train", [{"time": 1.0, "loss": 0.5, "note": "any text", "worker": "t"}])
        raw_metrics(db, "train", ['{"loss": "low"}', '{"worker": [1]}', "{" * 3000])
        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            for _ in range(3):
                assert db.metrics("episodes") == [episode(1.0)] and db.recent_returns(10) == [1.0]
                assert db.metrics("train") == [{"time": 1.0, "loss": 0.5, "note": "any text", "worker": "t"}]
        assert len(warnings_about(caplog, "skipped 6 malformed episodes metrics")) == 1
        assert len(warnings_about(caplog, "skipped 3 malformed train metrics")) == 1
        db.clear(metrics=True)
        assert db.metrics("episodes") == [] and db.metrics("train") == []


WRONG_TYPES = [  # a key of ours made another Redis type, and a call that meets it
    ("sessions", lambda r, k: r.rpush(k, "x"), lambda db: db.sample_batch(2)),
    ("seq", lambda r, k: r.hset(k, "x", 1), lambda db: db.add_sessions([tiny(1)], capacity=BIG)),
    ("lo", lambda r, k: r.rpush(k, "x"), lambda db: db.add_sessions([tiny(1)], capacity=BIG)),
    ("meta", lambda r, k: r.set(k, "x"), lambda db: db.setting("options")),
    ("params", lambda r, k: r.set(k, "x"), lambda db: db.params_version()),
    ("metrics:episodes", lambda r, k: r.set(k, "x"), lambda db: db.metrics("episodes")),
]


@pytest.mark.parametrize(("name", "make", "use"), WRONG_TYPES, ids=[w[0] for w in WRONG_TYPES])
def test_a_redis_key_of_another_type_is_named_and_clear_all_deletes_it(redis_server, prefix, name, make, use):
    db = connect(redis_server.url, prefix, retry_for=5)
    client = redis.Redis.from_url(redis_server.url)
    db.add_sessions([tiny(0)], capacity=BIG)
    client.delete(f"{prefix}:{name}")
    make(client, f"{prefix}:{name}")
    with pytest.raises(DatabaseError) as info:
        use(db)
    kind = client.type(f"{prefix}:{name}").decode()
    one_line(info.value, f"{prefix}:{name} holds a {kind}", "clear --all")
    db.clear(sessions=True, params=True, workers=True, metrics=True)
    assert client.type(f"{prefix}:{name}") == b"none"
    db.add_sessions([tiny(5)], capacity=BIG)
    assert markers(db.sample_batch(2)) == [5, 5] and db.params_version() is None and db.metrics("episodes") == []
    client.close()
    db.close()


def test_junk_in_the_list_of_prefixes_is_not_listed(redis_server, prefix):
    db = connect(redis_server.url, prefix, retry_for=5)
    db.add_sessions([tiny(0)], capacity=BIG)
    redis.Redis.from_url(redis_server.url).sadd("tinyverse:namespaces", b"\xff\xfe", "a b", "x:y", "")
    assert db.namespaces() == [prefix]
    db.close()


# -- a SQLite file of another application ------------------------------------------------------------------------------


def app_file(tmp_path, *extra: str):
    """Another application's SQLite file (rollback journal), with its own table named like one of tinyverse's."""
    path = tmp_path / "app.db"
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT)")
        conn.execute('CREATE TABLE "tinyverse:meta" (key TEXT PRIMARY KEY, value TEXT)')
        conn.execute('INSERT INTO "tinyverse:meta" VALUES (?, ?)', ("theme", "dark"))
        conn.executemany("INSERT INTO users (name) VALUES (?)", [("ada",), ("alan",)])
        for sql in extra:
            conn.execute(sql)
    conn.close()
    return path


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["DROP TABLE users", 'CREATE TRIGGER t AFTER INSERT ON "tinyverse:meta" BEGIN SELECT 1; END'],
        ["DROP TABLE users", 'CREATE VIEW "p:params" AS SELECT 1'],
        ["DROP TABLE users", "CREATE TABLE tinyverse_prefixes (prefix TEXT, other BLOB)"],
    ],
    ids=["tables", "trigger", "view", "fake-mark"],  # all but the first only name tables as tinyverse does
)
def test_a_sqlite_file_of_another_application_is_refused_before_anything_is_written(tmp_path, extra):
    path = app_file(tmp_path, *extra)
    before = path.read_bytes()
    for prefix in ("tinyverse", "other"):
        with pytest.raises(DatabaseError) as info:
            connect(f"sqlite:///{path}", prefix, retry_for=1)
        one_line(info.value, str(path), "not tinyverse's", "--db")
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]  # no journal
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    conn.close()


def test_clear_all_on_another_applications_file_deletes_nothing(tmp_path):
    path = app_file(tmp_path)
    before = path.read_bytes()
    proc = subprocess.run(
        [sys.executable, "-m", "tinyverse", "clear", "--all", "--db", f"sqlite:///{path}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "not tinyverse's" in proc.stderr, proc.stderr
    assert path.read_bytes() == before


def test_files_of_earlier_versions_are_adopted_and_marked(tmp_path):
    """Earlier versions named every table <prefix>:<name> and marked nothing: such a file keeps working."""
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    with conn:
        for prefix in ("old1", "old2"):
            for name, columns in TABLES.items():
                conn.execute(f'CREATE TABLE "{prefix}:{name}" ({columns})')
        conn.execute('INSERT INTO "old1:sessions" (data) VALUES (?)', (encode(tiny(4)),))
    conn.close()
    db = connect(f"sqlite:///{path}", "old1", retry_for=5)
    assert markers(db.get_batch([1])) == [4] and db.count_sessions() == (1, 1)
    assert db.namespaces() == ["old1", "old2"]
    client = raw(db)
    client.execute("INSERT INTO tinyverse_prefixes VALUES ('not a prefix!')")  # junk in the mark: not listed
    client.close()
    assert db.namespaces() == ["old1", "old2"]
    db.clear(sessions=True, params=True, workers=True, metrics=True)
    db.close()


# -- servers that never answer, files whose write lock another process holds -------------------------------------------


class SilentServer:
    """A TCP server that accepts connections and never answers: a hung Redis, or something else on its port."""

    def __init__(self, port: int = 0):
        self.sock = socket.create_server(("127.0.0.1", port))
        self.sock.settimeout(0.05)  # the accepting thread looks at self.open this often
        self.port, self.held, self.open = self.sock.getsockname()[1], [], True
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self):
        while self.open:
            try:
                self.held.append(self.sock.accept()[0])
            except TimeoutError:
                continue
            except OSError:  # closed
                return

    def close(self):
        self.open = False
        self.thread.join(5)
        self.sock.close()
        for conn in self.held:
            conn.close()


def test_a_tool_gives_up_on_a_silent_server_within_seconds(prefix):
    server = SilentServer()
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseError) as info:
            connect(f"redis://127.0.0.1:{server.port}/0", prefix, retry_for=2)
        assert time.monotonic() - started < 15
        one_line(info.value, "cannot reach database", str(server.port))
    finally:
        server.close()


def test_a_worker_waits_for_a_silent_server_and_says_so(tmp_path, prefix, caplog, monkeypatch):
    from conftest import RedisServer

    from tinyverse.database import redis as redis_backend

    monkeypatch.setattr(redis_backend, "ANSWER_WAIT", 0.5)  # the real wait, made short enough to see
    real = RedisServer(tmp_path)
    server = SilentServer(real.port)
    with caplog.at_level(logging.WARNING, logger="tinyverse"):
        thread, outcome = in_thread(lambda: connect(real.url, prefix, retry_for=None))
        try:
            wait_for(lambda: warnings_about(caplog, "unreachable"), 30, "the worker to say it waits")
            assert thread.is_alive(), "a worker waits for the server"
        finally:
            server.close()
        real.start()  # the server answers at last, on the same port
        try:
            thread.join(60)
            assert not thread.is_alive() and "error" not in outcome, outcome
            db = outcome["result"]
            db.add_sessions([tiny(3)], capacity=BIG)
            assert markers(db.sample_batch(1)) == [3]
            db.close()
        finally:
            real.stop()
    assert warnings_about(caplog, "is back")


def hold_write_lock(path) -> sqlite3.Connection:
    """Another connection that holds the file's write lock until it commits (as a long write of another process)."""
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    return holder


def test_a_tool_reports_a_held_write_lock_within_seconds(tmp_path, prefix):
    url = f"sqlite:///{tmp_path / 'held.db'}"
    connect(url, prefix, retry_for=5).close()
    holder = hold_write_lock(tmp_path / "held.db")
    try:
        started = time.monotonic()
        with pytest.raises(DatabaseError) as info:
            connect(url, prefix, retry_for=1)
        assert time.monotonic() - started < 10
        one_line(info.value, "held.db is locked by another process")
    finally:
        holder.execute("COMMIT")
        holder.close()


def test_a_worker_waits_out_a_held_write_lock_and_says_so(tmp_path, prefix, caplog, monkeypatch):
    from tinyverse.database import sqlite as sqlite_backend

    monkeypatch.setattr(sqlite_backend, "LOCK_WAIT", 0.3)  # the real wait, made short enough to see
    url = f"sqlite:///{tmp_path / 'held.db'}"
    connect(url, prefix, retry_for=5).close()
    holder = hold_write_lock(tmp_path / "held.db")
    with caplog.at_level(logging.WARNING, logger="tinyverse"):
        thread, outcome = in_thread(lambda: connect(url, prefix, retry_for=None))
        try:
            said = wait_for(lambda: warnings_about(caplog, "waiting for the write lock of"), 30, "the worker's word")
            assert said == [f"waiting for the write lock of {tmp_path / 'held.db'} held by another process"]
            assert thread.is_alive(), "a worker waits for the lock"
        finally:
            holder.execute("COMMIT")
            holder.close()
        thread.join(30)
    assert not thread.is_alive() and "error" not in outcome, outcome
    outcome["result"].close()
