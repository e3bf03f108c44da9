"""Named params snapshots: kept apart from the rolling params, listed, loaded by name or by version, deleted, bounded
and read as untrusted records, on both backends; run's verdict keeps the params that reached its target (K greedy
evals in a row with --target-passes) and its final eval, eval and export take them by name."""

import json
import sqlite3
import time

import numpy as np
import pytest
import redis
from conftest import ROOT, optional, run_cli
from test_hostile import bomb

from tinyverse.database import connect, snapshots
from tinyverse.errors import DatabaseError, RecordError
from tinyverse.ops.watch import Watch

FAKE = ROOT / "tests" / "fake_experiment.py"


def params_of(v: int) -> dict:
    """A params set whose every value is ``v``."""
    return {"w": np.full((4, 2), v, np.float32), "updates": np.array([v], np.int64)}


def held(db) -> list[tuple[str, int]]:
    return [(s.name, s.version) for s in db.snapshots()]


def raw_snapshot(db, name: str, **fields) -> None:
    """Write a snapshot's fields (version, time, data) past the database's checks, as any writer could."""
    if db.url.startswith("sqlite"):
        conn = sqlite3.connect(db.path, timeout=30)
        with conn:
            table = f'"{db.prefix}:snapshots"'
            conn.execute(f"INSERT OR IGNORE INTO {table} VALUES (?, 1, 0.0, x'')", (name,))
            for field, value in fields.items():
                conn.execute(f"UPDATE {table} SET {field} = ? WHERE name = ?", (value, name))
        conn.close()
    else:
        client = redis.Redis.from_url(db.url)
        client.hset(f"{db.prefix}:snapshot:{name}", mapping={"version": 1, "time": 0.0, "data": b"", **fields})
        client.close()


# -- the database: both backends ---------------------------------------------------------------------------------------
def test_snapshots_are_kept_apart_from_the_rolling_params(db):
    assert db.snapshots() == [] and db.find_params("passed") is None and db.find_params("v1") is None
    assert db.save_params(params_of(1)) == 1
    db.save_snapshot("passed", params_of(1), 1)
    assert db.save_params(params_of(2)) == 2  # the rolling params move on; the snapshot stays
    db.save_snapshot("v2", params_of(2), 2)
    db.save_snapshot("old", params_of(7), 7)  # any version, under any name
    assert held(db) == [("passed", 1), ("v2", 2), ("old", 7)]  # the oldest version first
    assert all(time.time() - 60 < s.time <= time.time() for s in db.snapshots())
    version, params = db.find_params("passed")
    assert version == 1 and params["w"].dtype == np.float32 and (params["w"] == 1).all()
    assert db.find_params("v7")[0] == 7, "by version: a snapshot's"
    assert db.find_params("v2")[0] == 2 and db.find_params("latest")[0] == 2 and db.find_params(None)[0] == 2
    assert db.find_params("v3") is None and db.find_params("nothing") is None and db.find_params("v") is None
    db.save_snapshot("passed", params_of(2), 2)  # replaced
    assert held(db) == [("v2", 2), ("passed", 2), ("old", 7)]  # of one version: the older save first
    assert db.delete_snapshot("old") and not db.delete_snapshot("old") and not db.delete_snapshot("no such")
    assert db.find_params("v7") is None and db.load_params("old") is None
    assert db.save_params(params_of(3)) == 3
    assert db.find_params("v1") is None, "version 1 is neither a snapshot's nor the latest any more"
    db.clear(sessions=True, metrics=True)
    assert len(db.snapshots()) == 2, "only clearing the params clears their snapshots"
    db.clear(params=True)
    assert db.snapshots() == [] and db.params_version() is None


def test_two_prefixes_do_not_share_snapshots(db, db_url, prefix):
    other = connect(db_url, f"{prefix}-other", retry_for=5)
    try:
        db.save_snapshot("passed", params_of(1), 1)
        assert other.snapshots() == [] and other.find_params("passed") is None
        other.clear(params=True)
        assert held(db) == [("passed", 1)]
    finally:
        other.clear(sessions=True, params=True, workers=True, metrics=True)
        other.close()


@pytest.mark.parametrize("name", ["latest", "", "a b", "a:b", "x" * 65, "../up", "*"])
def test_a_bad_name_is_refused_before_anything_is_stored(db, name):
    with pytest.raises(DatabaseError, match="bad snapshot name"):
        db.save_snapshot(name, params_of(1), 1)
    assert db.snapshots() == [] and db.find_params(name) in (None, db.load_params())


def test_snapshots_are_bounded_in_number(db, monkeypatch):
    monkeypatch.setattr(snapshots, "MAX_SNAPSHOTS", 3)
    for v in (1, 2, 3):
        db.save_snapshot(f"v{v}", params_of(v), v)
    with pytest.raises(DatabaseError) as refused:
        db.save_snapshot("v4", params_of(4), 4)
    message = str(refused.value)
    assert "\n" not in message and "holds 3 snapshots, the most it keeps" in message and "clear --del-params" in message
    db.save_snapshot("v3", params_of(30), 30)  # a name it holds is replaced, not added
    assert held(db) == [("v1", 1), ("v2", 2), ("v3", 30)]


# -- what any writer may have written there ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("field", "junk"), [("version", "abc"), ("version", "-3"), ("time", "nan"), ("version", "1.5")]
)
def test_a_snapshot_of_junk_is_skipped_in_the_list_and_refused_in_one_line_by_name(db, caplog, field, junk):
    db.save_snapshot("good", params_of(1), 1)
    db.save_snapshot("bad", params_of(2), 2)
    raw_snapshot(db, "bad", **{field: junk})
    assert held(db) == [("good", 1)]
    assert "skipped 1 malformed snapshots" in caplog.text and "clear --del-params" in caplog.text
    with pytest.raises(DatabaseError) as refused:
        db.load_params("bad")
    message = str(refused.value)
    assert "\n" not in message and "snapshot 'bad' of" in message and field in message, message


@pytest.mark.parametrize("data", [b"not a record", bomb()], ids=["garbage", "huge-declared-size"])
def test_a_corrupt_or_oversized_snapshot_record_is_one_line_without_its_memory(db, data):
    import resource

    db.save_snapshot("bad", params_of(1), 1)
    raw_snapshot(db, "bad", data=data)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(RecordError) as refused:
        db.find_params("bad")
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024 < 64, "refused without allocating it"
    message = str(refused.value)
    assert "\n" not in message and "snapshot 'bad'" in message and "corrupt or foreign record" in message, message
    assert held(db) == [("bad", 1)], "listing reads no record"


def test_a_junk_name_is_not_listed(db, caplog):
    db.save_snapshot("good", params_of(1), 1)
    for name in ("a b", "latest", "x" * 70):
        raw_snapshot(db, name)
    assert held(db) == [("good", 1)]


def test_a_redis_snapshot_of_another_type_is_named_and_clear_all_deletes_it(redis_url, prefix):
    db = connect(redis_url, prefix, retry_for=5)
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(f"{prefix}:snapshot:passed", "a string, not a hash")
        with pytest.raises(DatabaseError) as refused:
            db.snapshots()
        message = str(refused.value)
        assert (
            "\n" not in message and f"{prefix}:snapshot:passed holds a string" in message and "clear --all" in message
        )
        db.clear(sessions=True, params=True, workers=True, metrics=True)
        assert client.exists(f"{prefix}:snapshot:passed") == 0 and db.snapshots() == []
    finally:
        client.close()
        db.close()


# -- run's verdict -----------------------------------------------------------------------------------------------------
class Judge:
    """Greedy evals of given means, of the latest params as they are stored: what run's judge returns."""

    def __init__(self, db, means: list[float]):
        self.db, self.means = db, list(means)

    def __call__(self):
        version, params = self.db.load_params()
        self.db.save_params(params_of(version + 1))  # the trainer publishes on meanwhile
        return version, params, [self.means.pop(0)] * 4


def judged(watch: Watch) -> str | None:
    watch.judged -= 30  # as if the 30 s between two greedy evals had passed
    return watch.check()


def test_target_passes_wants_that_many_greedy_evals_in_a_row_and_keeps_the_last_ones_params(tmp_path):
    db = connect(f"sqlite:///{tmp_path / 'watch.db'}", "watch")
    db.save_params(params_of(1))
    watch = Watch(db, 8, None, target=10, judge=Judge(db, [10, 11, 9, 10, 12, 15]), passes=3)
    assert [judged(watch) for _ in range(5)] == [None] * 5, "two in a row, then a miss: counted afresh"
    assert not watch.reached and db.snapshots() == []
    reason = judged(watch)
    assert reason == (
        "greedy eval's mean return 15.0 ± 0 over 4 episodes of params v6 reached the target 10 (3 evals in a row); "
        "kept as snapshot passed"
    )
    assert watch.reached and watch.verdict.version == 6 and held(db) == [("passed", 6)]
    assert db.params_version() == 7, "the rolling params moved on"
    np.testing.assert_array_equal(db.find_params("passed")[1]["w"], params_of(6)["w"])


def test_a_target_on_training_returns_keeps_the_params_of_that_moment_and_says_what_it_judged(tmp_path):
    db = connect(f"sqlite:///{tmp_path / 'watch.db'}", "watch")
    db.save_params(params_of(5), min_version=5)
    watch = Watch(db, 8, None, target=0.9)
    episodes = [{"return": 1.0, "time": time.time(), "steps": 8, "version": 3 + i // 10} for i in range(20)]
    db.add_metrics("episodes", episodes)
    assert watch.check() == (
        "recent mean return 1.00 ± 0 over 20 episodes reached the target 0.9 in training (params v3 to v4, "
        "exploring); kept the latest params, v5, as snapshot passed"
    )
    assert held(db) == [("passed", 5)]


# -- eval, export, import, info, clear by name, through the CLI --------------------------------------------------------
def test_eval_export_import_info_and_clear_take_snapshots_by_name(tmp_path, redis_url, prefix):
    optional("safetensors")
    url = f"sqlite:///{tmp_path / 'run.db'}"
    run_cli(FAKE, "play", "-n", "2", "-q", "--db", url, "--set", "max_steps=20")
    db = connect(url, "fake_experiment", retry_for=5)
    for name, updates in (("early", 1), ("passed", 1), (None, 2)):  # v1 (the player's), v2, v3, then v4, v5
        run_cli(FAKE, "train", "-n", updates, "-s", "1", "-q", "--db", url)
        if name is not None:
            db.save_snapshot(name, *db.load_params()[::-1])

    def evaluated(*params) -> str:
        out = run_cli(FAKE, "eval", "-n", "1", "--no-record", "--db", url, *params, cwd=tmp_path).stdout
        return out.splitlines()[-2]

    assert evaluated().endswith("(params v5)") and evaluated("--params", "latest").endswith("(params v5)")
    assert evaluated("--params", "passed").endswith("(params v3)") and evaluated("--params", "v3").endswith(
        "(params v3)"
    )
    assert evaluated("--params", "v2").endswith("(params v2)")
    for unknown in ("v4", "best"):
        proc = run_cli(FAKE, "eval", "--params", unknown, "--db", url, cwd=tmp_path, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 1 and len(lines) == 1, proc.stderr
        assert f"no params '{unknown}' in prefix fake_experiment" in lines[0]
        assert "its snapshots: early (v2), passed (v3); the latest params: v5" in lines[0]

    info = run_cli(FAKE, "info", "--db", url).stdout
    assert "  snapshots passed v3 (" in info and "), early v2 (" in info, info

    agent = tmp_path / "agent.safetensors"
    out = run_cli(FAKE, "export", "-o", agent, "--db", url).stdout
    assert "params version 3 of prefix fake_experiment (snapshot passed, run's verdict" in out
    assert "snapshots in it: 2" in out
    assert "params version 5 " in run_cli(FAKE, "export", "-o", tmp_path / "v5.safetensors", "--params", "latest",
                                          "--db", url).stdout  # fmt: skip
    assert "params version 2 " in run_cli(FAKE, "export", "-o", tmp_path / "v2.safetensors", "--params", "early",
                                          "--db", url).stdout  # fmt: skip
    proc = run_cli(FAKE, "export", "--params", "v4", "--db", url, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1 and "no params 'v4'" in proc.stderr

    # the file plays the verdict's params; the snapshots travel with it into another database
    assert (
        run_cli(FAKE, "eval", "-n", "1", "--no-record", "--params", agent)
        .stdout.splitlines()[-2]
        .endswith("(params v3)")
    )
    run_cli(FAKE, "import", agent, "--db", redis_url, "--prefix", prefix)
    moved = connect(redis_url, prefix, retry_for=5)
    assert moved.params_version() == 3 and held(moved) == [("early", 2), ("passed", 3)]
    for name in ("passed", "early"):
        for k, v in db.load_params(name)[1].items():
            np.testing.assert_array_equal(moved.load_params(name)[1][k], v)

    assert run_cli(FAKE, "clear", "--del-params", "--db", url).returncode == 0
    assert db.snapshots() == [] and "snapshots" not in run_cli(FAKE, "info", "--db", url).stdout
    moved.close()
    db.close()


LISTS = [  # what a forged file's metadata may list as its snapshots
    "[{]",
    json.dumps([{"name": "a b", "version": 1, "time": 0}]),
    json.dumps([{"name": "x", "version": True, "time": 0}]),
    json.dumps([{"name": "x", "version": 1, "time": 0}] * 2),
    json.dumps([{"name": f"s{i}", "version": 1, "time": 0} for i in range(101)]),
]


@pytest.mark.parametrize("snapshots_meta", LISTS)
def test_a_file_listing_snapshots_not_as_export_writes_them_is_refused_in_one_line(tmp_path, snapshots_meta):
    st = optional("safetensors.numpy")
    path = tmp_path / "forged.safetensors"
    meta = {"format": "tinyverse-params", "version": "1", "options": "null", "snapshots": snapshots_meta}
    st.save_file({"w": np.zeros((4, 2), np.float32), "updates": np.zeros(1, np.int64)}, path, metadata=meta)
    proc = run_cli(FAKE, "eval", "--params", path, "--no-record", check=False)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "lists snapshots not as export writes them" in proc.stderr


PASSES = [["0"], ["-1"], ["x"], ["1.5"], ["2", "--target-return", "5"], ["2", "--target-eval", "3"]]


@pytest.mark.parametrize("bad", PASSES)
def test_target_passes_is_a_whole_number_from_1_that_counts_greedy_evals(tmp_path, bad):
    proc = run_cli(FAKE, "run", "--target-passes", *bad, "--db", f"sqlite:///{tmp_path / 'x.db'}", check=False)
    assert proc.returncode == 1 and "--target-passes" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "x.db").exists(), "refused before anything ran"
