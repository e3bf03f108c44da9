"""The database contract: one conformance suite, run against every backend through the ``db`` fixture.

Backend-specific code is limited to writing and reading raw records past the
encoder (to plant foreign data) and to checking, without timing anything, that
sampling does a bounded amount of work whatever the number of sessions stored.
"""

import inspect
import logging
import pickle
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

from tinyverse.database import base, connect
from tinyverse.database.sqlite import SQLiteDatabase
from tinyverse.encoding import decode, encode
from tinyverse.errors import DatabaseError

BIG = 10**6


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
    assert set(s) == {"observations", "actions", "terminated", "frames", "who"} | ({"id"} if sampled else set())
    if sampled:
        assert s["id"].dtype == np.int64 and s["id"].shape == () and s["id"] >= 1
    worker, i = (int(x) for x in s["who"])
    want = make_session(i, worker)
    for k, v in want.items():
        assert s[k].dtype == v.dtype and s[k].shape == v.shape, k
        np.testing.assert_array_equal(s[k], v, err_msg=k)
    return worker, i


def tiny(i: int) -> dict:
    return {"i": np.array(i, np.int64)}


def markers(sessions) -> list[int]:
    return [int(s["i"]) for s in sessions]


def params_of(v: int) -> dict:
    """A params set whose every value is ``v``: a mix of two publishes cannot pass for one."""
    return {
        "w": np.full((128, 256), v, np.float32),
        "b": np.full(2048, v, np.float64),
        "steps": np.array(v, np.int64),
        "z": np.full((3, 3, 3), v, np.int32),
    }


def wait_for(condition, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.02)


def is_sqlite(db) -> bool:
    return isinstance(db, SQLiteDatabase)


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


def raw_records(db) -> list[tuple[int, bytes]]:
    """Every stored session record as (id, raw bytes), read straight from the backend."""
    if is_sqlite(db):
        conn = sqlite3.connect(db.path, timeout=30)
        rows = conn.execute(f'SELECT id, data FROM "{db.prefix}:sessions" ORDER BY id').fetchall()
        conn.close()
        return rows
    r = redis.Redis.from_url(db.url)
    rows = sorted((int(k), v) for k, v in r.hgetall(f"{db.prefix}:sessions").items())
    r.close()
    return rows


# -- real processes: small scripts run with the helpers above, importing only the core --------


def child_script(main: str) -> str:
    helpers = [inspect.getsource(f) for f in (make_session, params_of)]
    head = "import os, sys\nimport numpy as np\nfrom tinyverse.database import connect\n"
    return "\n\n".join([head, *helpers, textwrap.dedent(main)])


WRITE_SESSIONS = child_script(
    """
    url, prefix, worker, n, capacity = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:])
    db = connect(url, prefix, retry_for=60)
    for i in range(n):
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


# -- the conformance suite: every test runs once per backend -----------------------


class TestSessions:
    def test_empty_database(self, db):
        assert db.count_sessions() == (0, 0)
        assert db.sample_sessions(5) == []
        assert db.capacity() is None

    def test_append_count_sample(self, db):
        db.add_sessions([make_session(i) for i in range(3)])
        db.add_sessions([make_session(3)])
        assert db.count_sessions() == (4, 4)
        got = db.sample_sessions(50)
        assert len(got) == 50
        assert {check_session(s) for s in got} <= {(0, i) for i in range(4)}

    @pytest.mark.parametrize("n", [0, 1, 7, 300])
    def test_sample_returns_n_items_in_one_call(self, db, n):
        db.add_sessions([tiny(i) for i in range(3)])
        got = db.sample_sessions(n)
        assert len(got) == n  # with replacement: more than stored is fine
        assert set(markers(got)) <= {0, 1, 2}

    def test_sampling_is_uniform(self, db):
        db.add_sessions([tiny(i) for i in range(10)])
        counts = Counter(markers(db.sample_sessions(5000)))
        assert set(counts) == set(range(10))
        # 500 expected each, standard deviation ~21: a loose band that only a biased sampler leaves
        assert all(350 < c < 650 for c in counts.values()), counts

    def test_eviction_keeps_exactly_the_newest(self, db):
        db.add_sessions([tiny(i) for i in range(3)], capacity=5)
        db.add_sessions([tiny(i) for i in range(3, 12)], capacity=5)  # one call past capacity
        db.add_sessions([tiny(12)], capacity=5)
        assert db.count_sessions() == (5, 13)
        got = db.sample_sessions(400)
        assert set(markers(got)) == {8, 9, 10, 11, 12}
        assert all(int(s["id"]) == int(s["i"]) + 1 for s in got), "each session carries the id it was added under"
        assert [i for i, _ in raw_records(db)] == [9, 10, 11, 12, 13]

    def test_the_first_capacity_sticks(self, db):
        db.add_sessions([tiny(0)], capacity=4)
        assert db.capacity() == 4
        db.add_sessions([tiny(i) for i in range(1, 10)], capacity=100)
        assert db.capacity() == 4
        assert db.count_sessions() == (4, 10)

    def test_capacity_set_later_evicts_at_once(self, db):
        db.add_sessions([tiny(i) for i in range(10)], capacity=100)
        db.set_capacity(3)
        assert db.capacity() == 3
        assert db.count_sessions() == (3, 10)
        assert set(markers(db.sample_sessions(200))) == {7, 8, 9}
        db.set_capacity(6)
        db.add_sessions([tiny(i) for i in range(10, 15)], capacity=100)
        assert db.count_sessions() == (6, 15)
        assert set(markers(db.sample_sessions(300))) == set(range(9, 15))

    @pytest.mark.parametrize("bad", [0, -5])
    def test_capacity_must_be_positive(self, db, bad):
        with pytest.raises(DatabaseError, match="positive"):
            db.set_capacity(bad)

    def test_an_empty_append_changes_nothing(self, db):
        db.add_sessions([tiny(i) for i in range(5)], capacity=5)
        db.add_metrics("episodes", [{"return": float(i)} for i in range(50)])  # other rows, same connection
        db.add_sessions([], capacity=5)
        assert db.count_sessions() == (5, 5)
        assert set(markers(db.sample_sessions(200))) == set(range(5))

    def test_twenty_thousand_sessions(self, db):
        for start in range(0, 20_000, 2_000):
            db.add_sessions([tiny(i) for i in range(start, start + 2_000)], capacity=BIG)
        assert db.count_sessions() == (20_000, 20_000)
        got = markers(db.sample_sessions(256))
        assert len(got) == 256 and all(0 <= i < 20_000 for i in got)
        assert len(set(got)) > 200  # draws spread over the whole range, not a few rows
        db.set_capacity(1_000)
        assert db.count_sessions() == (1_000, 20_000)
        got = markers(db.sample_sessions(256))
        assert len(got) == 256 and all(19_000 <= i < 20_000 for i in got)


class TestSessionIds:
    def test_range_and_get_by_id(self, db):
        lo, hi = db.session_range()
        assert hi < lo
        assert db.get_sessions([1, 2]) == {} and db.get_sessions([]) == {}
        db.add_sessions([tiny(i) for i in range(10)], capacity=6)
        assert db.session_range() == (5, 10)
        got = db.get_sessions([10, 5, 4, 7, 7, 99])  # evicted, repeated and unknown ids
        assert sorted(got) == [5, 7, 10]
        assert {i: (int(s["i"]), int(s["id"])) for i, s in got.items()} == {5: (4, 5), 7: (6, 7), 10: (9, 10)}
        assert db.get_sessions(np.array([6, 8])).keys() == {6, 8}
        db.clear(sessions=True)
        lo, hi = db.session_range()
        assert hi < lo and db.get_sessions([5, 10]) == {}

    def test_batches_stack_whole_sessions_with_their_ids(self, db):
        assert db.sample_batch(4) == {} and db.get_batch([1, 2]) == {} and db.get_batch([]) == {}
        db.add_sessions([make_session(i) for i in range(10)], capacity=6)  # ids 5..10 stay
        batch = db.sample_batch(16)
        assert set(batch) == {"observations", "actions", "terminated", "frames", "who", "id"}
        assert batch["id"].dtype == np.int64 and batch["id"].shape == (16,)
        assert set(batch["id"].tolist()) <= set(range(5, 11))
        for j, i in enumerate(batch["id"].tolist()):
            row = {k: v[j] for k, v in batch.items()}
            assert check_session(row) == (0, i - 1)
        batch = db.get_batch([10, 5, 4, 7, 7, 99])  # evicted, repeated and unknown ids
        assert batch["id"].tolist() == [10, 5, 7, 7]
        assert batch["who"][:, 1].tolist() == [9, 4, 6, 6]
        assert db.sample_batch(0) == {}

    def test_a_batch_leaves_out_sessions_of_another_shape(self, db, caplog):
        db.add_sessions([tiny(i) for i in range(3)])
        db.add_sessions([{"i": np.arange(2)}])  # the experiment changed
        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            batch = db.get_batch([1, 4, 2, 3])
        assert batch["id"].tolist() == [1, 2, 3] and batch["i"].tolist() == [0, 1, 2]
        assert "dropped 1 sessions of another shape" in caplog.text and db.skipped == 0

    def test_sampled_ids_fetch_the_same_sessions(self, db):
        db.add_sessions([make_session(i) for i in range(20)])
        sampled = db.sample_sessions(8)
        again = db.get_sessions([int(s["id"]) for s in sampled])
        for s in sampled:
            assert check_session(again[int(s["id"])]) == check_session(s)


class TestForeignRecords:
    def test_corrupt_and_foreign_records_are_skipped_with_a_warning(self, db, caplog, tmp_path):
        target = tmp_path / "pwned"

        class Payload:
            def __reduce__(self):
                return (open, (str(target), "w"))

        db.add_sessions([tiny(i) for i in range(4)])
        bad = [
            b"garbage",
            b"",
            pickle.dumps(Payload()),
            pickle.dumps({"i": np.array(1)}),
            encode(tiny(99))[:-3],  # truncated
            encode(tiny(99)) + b"x",  # trailing bytes
        ]
        if is_sqlite(db):  # SQLite stores whatever type it is given
            bad += ["a text value", 12345, 1.5]
        for data in bad:
            raw_insert(db, data)
        assert db.count_sessions()[0] == 4 + len(bad)

        with caplog.at_level(logging.WARNING, logger="tinyverse"):
            got = db.sample_sessions(300)
        assert set(markers(got)) <= {0, 1, 2, 3}
        assert len(got) + db.skipped == 300
        assert db.skipped > 0
        assert "skipped" in caplog.text and "corrupt or foreign record" in caplog.text
        assert not target.exists()

        # batches skip them the same way
        skipped = db.skipped
        batch = db.sample_batch(300)
        assert set(batch["i"].tolist()) <= {0, 1, 2, 3}
        assert len(batch["id"]) + db.skipped - skipped == 300

        # fetching by id skips them the same way
        skipped = db.skipped
        lo, hi = db.session_range()
        assert set(markers(db.get_sessions(list(range(lo, hi + 1))).values())) == {0, 1, 2, 3}
        assert db.skipped == skipped + len(bad)

        # nothing stored was lost, and the good sessions still sample
        assert db.count_sessions()[0] == 4 + len(bad)
        db.add_sessions([tiny(4)])
        assert 4 in markers(db.sample_sessions(500))


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


class TestWorkers:
    def test_heartbeat_list_replace_remove(self, db):
        assert db.workers() == []
        db.heartbeat("p1", {"id": "p1", "role": "player", "sessions": 1}, ttl=60)
        db.heartbeat("t1", {"id": "t1", "role": "trainer", "steps": 0}, ttl=60)
        db.heartbeat("p1", {"id": "p1", "role": "player", "sessions": 2}, ttl=60)  # replaces, not adds
        got = sorted(db.workers(), key=lambda w: w["id"])
        assert got == [{"id": "p1", "role": "player", "sessions": 2}, {"id": "t1", "role": "trainer", "steps": 0}]
        db.remove_worker("p1")
        assert [w["id"] for w in db.workers()] == ["t1"]
        db.remove_worker("never-there")
        assert [w["id"] for w in db.workers()] == ["t1"]

    def test_heartbeats_expire(self, db):
        db.heartbeat("short", {"id": "short"}, ttl=0.3)
        db.heartbeat("long", {"id": "long"}, ttl=120)
        wait_for(lambda: [w["id"] for w in db.workers()] == ["long"], "the short heartbeat to expire")
        db.heartbeat("short", {"id": "short"}, ttl=120)  # a worker that comes back is listed again
        assert sorted(w["id"] for w in db.workers()) == ["long", "short"]


class TestMetrics:
    def test_ordered_per_kind(self, db):
        assert db.metrics("episodes") == []
        db.add_metrics("episodes", [{"return": float(i)} for i in range(5)])
        db.add_metrics("train", [{"loss": 0.5}])
        db.add_metrics("episodes", [{"return": 5.0}])
        db.add_metrics("episodes", [])
        assert [m["return"] for m in db.metrics("episodes")] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
        assert [m["return"] for m in db.metrics("episodes", 2)] == [4.0, 5.0]
        assert db.metrics("train") == [{"loss": 0.5}]
        assert db.metrics("other") == []

    def test_asking_for_none_gets_none(self, db):
        db.add_metrics("episodes", [{"return": 1.0}, {"return": 2.0}])
        assert db.metrics("episodes", 0) == []

    def test_bounded(self, db, monkeypatch):
        monkeypatch.setattr(base, "METRICS_LIMIT", 10)  # the real limit, made small enough to reach
        for start in range(0, 25, 5):
            db.add_metrics("episodes", [{"n": i} for i in range(start, start + 5)])
        db.add_metrics("train", [{"n": -1}])
        assert [m["n"] for m in db.metrics("episodes")] == list(range(15, 25))
        db.add_metrics("episodes", [{"n": i} for i in range(25, 60)])  # one call far past the limit
        assert [m["n"] for m in db.metrics("episodes")] == list(range(50, 60))
        assert db.metrics("train") == [{"n": -1}]


PARTS = ["sessions", "params", "workers", "metrics"]


def fill(db) -> None:
    db.add_sessions([tiny(i) for i in range(3)])
    db.save_params(params_of(1))
    db.heartbeat("w", {"id": "w"}, ttl=60)
    db.add_metrics("episodes", [{"return": 1.0}])


def present(db) -> dict[str, bool]:
    return {
        "sessions": db.count_sessions()[0] == 3 and len(db.sample_sessions(2)) == 2,
        "params": db.params_version() == 1 and db.load_params() is not None,
        "workers": db.workers() == [{"id": "w"}],
        "metrics": db.metrics("episodes") == [{"return": 1.0}],
    }


class TestClear:
    @pytest.mark.parametrize("part", PARTS)
    def test_clear_one_part_leaves_the_others(self, db, part):
        fill(db)
        db.clear(**{part: True})
        assert present(db) == {p: p != part for p in PARTS}

    def test_clear_nothing_and_everything(self, db):
        fill(db)
        db.clear()
        assert all(present(db).values())
        db.clear(sessions=True, params=True, workers=True, metrics=True)
        assert not any(present(db).values())
        assert db.sample_sessions(3) == [] and db.load_params() is None

    def test_sessions_after_a_clear(self, db):
        db.add_sessions([tiny(i) for i in range(5)], capacity=4)
        db.clear(sessions=True)
        assert db.count_sessions() == (0, 5)  # stored now, ever added
        assert db.sample_sessions(4) == []
        db.add_sessions([tiny(i) for i in range(5, 11)], capacity=4)
        assert db.count_sessions() == (4, 11)
        assert set(markers(db.sample_sessions(200))) == {7, 8, 9, 10}


class TestNamespaces:
    def test_two_prefixes_do_not_see_each_other(self, db, db_url):
        other_prefix = f"test-{uuid.uuid4().hex[:10]}"
        other = connect(db_url, other_prefix, retry_for=5)
        try:
            fill(db)
            assert other.count_sessions() == (0, 0) and other.sample_sessions(3) == []
            assert other.params_version() is None and other.workers() == [] and other.metrics("episodes") == []
            other.add_sessions([tiny(100)], capacity=1)
            other.save_params(params_of(1), min_version=40)
            assert markers(other.sample_sessions(3)) == [100, 100, 100]
            assert all(present(db).values()) and db.capacity() != 1

            assert {db.prefix, other_prefix} <= set(db.namespaces())
            assert db.namespaces() == sorted(db.namespaces())

            other.clear(sessions=True, params=True, workers=True, metrics=True)
            assert all(present(db).values())
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
    def test_concurrent_writer_processes_lose_nothing(self, db, db_url, capacity):
        writers, per_writer = 4, 200
        procs = [start(WRITE_SESSIONS, db_url, db.prefix, w, per_writer, capacity) for w in range(writers)]
        sampled, last_added = 0, 0
        while any(p.poll() is None for p in procs):  # read while they write
            stored, added = db.count_sessions()
            assert added >= last_added and stored <= min(added, capacity)
            last_added = added
            for s in db.sample_sessions(16):
                check_session(s)
                sampled += 1
        join_all(procs)
        total = writers * per_writer
        assert db.count_sessions() == (min(total, capacity), total)
        records = raw_records(db)
        assert [i for i, _ in records] == list(range(total - min(total, capacity) + 1, total + 1))
        seen = [check_session(decode(data), sampled=False) for _, data in records]
        if capacity >= total:
            assert sorted(seen) == [(w, i) for w in range(writers) for i in range(per_writer)]
        assert db.skipped == 0
        for s in db.sample_sessions(64):
            check_session(s)

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
            assert len(db.get_sessions(list(range(lo, hi + 1)))) == max(hi - lo + 1, 0), f"after clear {clears}"
        join_all([writer])
        stored, added = db.count_sessions()
        records = raw_records(db)
        assert added == 300 and stored == len(records), f"count says {stored}, {len(records)} stored"
        assert [i for i, _ in records] == list(range(added - stored + 1, added + 1))
        assert len(db.sample_sessions(32)) == (32 if stored else 0)
        assert clears > 0

    def test_writers_killed_mid_stream_leave_no_damage(self, db, db_url, tmp_path):
        sessions = start(WRITE_SESSIONS, db_url, db.prefix, 3, BIG, BIG)
        params = start(PUBLISH_PARAMS, db_url, db.prefix, tmp_path / "never")
        try:
            wait_for(lambda: db.count_sessions()[1] >= 100 and (db.params_version() or 0) >= 10, "both writers")
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
        db.db.set_progress_handler(tick, 10)  # one tick per 10 instructions
        steps[0] = 0
        try:
            fn()
        finally:
            db.db.set_progress_handler(None, 10)
        return steps[0]

    db.add_sessions([tiny(i) for i in range(1_000)], capacity=BIG)
    small = [work(lambda: db.sample_sessions(64)), work(db.count_sessions)]
    for start in range(1_000, 20_000, 1_900):
        db.add_sessions([tiny(i) for i in range(start, start + 1_900)])
    large = [work(lambda: db.sample_sessions(64)), work(db.count_sessions)]
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
        for start in range(stored, upto, 2_000):
            db.add_sessions([tiny(i) for i in range(start, min(start + 2_000, upto))])

    bounded = {"get", "mget", "hget", "hmget", "exists", "hexists", "evalsha", "eval"}
    db.add_sessions([tiny(0)], capacity=BIG)
    db.sample_sessions(1)  # loads any script once, so that only the steady state is counted
    seen = {}
    for size in (1_000, 20_000):
        fill(size)
        db.sample_sessions(1)  # the first call loads the Lua script into the server
        seen[size] = [commands(lambda: db.sample_sessions(64)), commands(db.count_sessions)]
        for calls in seen[size]:
            assert set(calls) <= bounded, calls
        assert sum(seen[size][0].values()) <= 64 + 4 and sum(seen[size][1].values()) <= 3
    assert seen[1_000] == seen[20_000]
    assert db.count_sessions() == (20_000, 20_000)
    admin.close()
    db.close()


# -- bad URLs and servers that go away -------------------------------------------------


def closed_port() -> int:
    from conftest import free_port

    return free_port()


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


def test_sqlite_in_a_missing_folder(tmp_path):
    with pytest.raises(DatabaseError, match="--db"):
        connect(f"sqlite:///{tmp_path / 'no' / 'such' / 'dir.db'}", "p", retry_for=1)


def test_sqlite_file_that_is_not_a_database(tmp_path):
    path = tmp_path / "notes.db"
    path.write_bytes(b"these are my notes, not a database" * 100)
    with pytest.raises(DatabaseError, match="notes.db"):
        connect(f"sqlite:///{path}", "p", retry_for=1)
    assert path.read_bytes().startswith(b"these are my notes")  # and it is left alone


def test_redis_restart_is_waited_out(redis_server, prefix, caplog):
    db = connect(redis_server.url, prefix, retry_for=None)  # as players and trainers run: wait for ever
    db.add_sessions([make_session(1)])
    db.save_params(params_of(1))
    redis_server.stop()

    result: dict = {}

    def use():
        try:
            db.add_sessions([make_session(2)])
            result["sample"] = db.sample_sessions(8)
            result["count"] = db.count_sessions()
        except Exception as e:  # surfaced to the test below
            result["error"] = e

    with caplog.at_level(logging.WARNING, logger="tinyverse"):
        thread = threading.Thread(target=use, daemon=True)
        thread.start()
        wait_for(lambda: "unreachable" in caplog.text, "the client to report the outage")
        assert thread.is_alive(), "the client waits while the server is down"
        redis_server.start()
        thread.join(60)
        assert not thread.is_alive(), "the client carried on once the server was back"
    assert "error" not in result, result.get("error")
    assert "is back" in caplog.text
    # the private server keeps nothing across a restart; what was written after it is there
    # (a retried append may apply twice: the contract allows duplicates, never damage)
    assert 1 <= result["count"][0] <= 2
    assert [check_session(s) for s in result["sample"]] == [(0, 2)] * 8
    assert db.load_params() is None
    db.save_params(params_of(1))
    assert db.params_version() == 1

    # with a bound on the wait, a server that stays down is one clear error
    redis_server.stop()
    db.retry_for = 1
    with pytest.raises(DatabaseError, match="cannot reach database"):
        db.count_sessions()
    db.close()
