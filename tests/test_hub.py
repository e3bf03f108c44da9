"""Nothing lost under load (bench/hub.py's load, made small): acknowledged sessions are readable or were
evicted in order, batches keep one layout, params versions never go backwards (read from a replica too),
and a killed writer leaves no partial record. Writers are real processes on a private redis-server or a
SQLite file."""

import signal
import subprocess
import sys

import numpy as np
import pytest
import redis
from conftest import ROOT, free_port, wait_for

from tinyverse.database import connect
from tinyverse.database import split_replica as _replica
from tinyverse.encoding import encode
from tinyverse.errors import DatabaseError

# a writer: N rounds of B sessions tagged (writer, n), each acknowledged round logged after add_sessions returns
WRITER = """
import sys, numpy as np
from tinyverse.database import connect
url, prefix, me, rounds, B, cap, log = sys.argv[1:8]
db = connect(url, prefix)
with open(log, "w") as f:
    for n in range(int(rounds)):
        s = [{"observations": np.full((9, 4), n, np.float32), "writer": np.int64(me), "n": np.int64(n * int(B) + k)}
             for k in range(int(B))]
        db.add_sessions(s, int(cap))
        f.write(f"{n}\\n")
        f.flush()
"""

# a pusher: compare-and-set params until it has saved ``pushes`` versions
PUSHER = """
import sys, numpy as np
from tinyverse.database import connect
url, prefix, pushes = sys.argv[1], sys.argv[2], int(sys.argv[3])
db = connect(url, prefix)
done = 0
while done < pushes:
    v = db.params_version() or 0
    if db.save_params({"w": np.full(1000, v + 1, np.float32)}, expect=v) is not None:
        done += 1
"""

# a writer to kill: big sessions and big params, for ever
ENDLESS = """
import sys, numpy as np
from tinyverse.database import connect
db = connect(sys.argv[1], sys.argv[2])
rng = np.random.default_rng(0)
for n in range(10**9):
    db.add_sessions([{"observations": rng.integers(0, 255, (26, 80, 80), np.uint8)} for _ in range(8)], 10**6)
    db.save_params({"w": np.full(500_000, n, np.float32)})
    print(n, flush=True)
"""


def spawn(code, *args):
    return subprocess.Popen([sys.executable, "-c", code, *map(str, args)], cwd=ROOT, stdout=subprocess.PIPE)


@pytest.fixture(params=["sqlite", "redis"])
def url(request, tmp_path):
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'hub.db'}"
    else:
        yield request.getfixturevalue("redis_server").url


def test_acknowledged_sessions_are_stored_or_evicted_in_order(url, tmp_path):
    writers, rounds, B, cap = 4, 40, 3, 200
    procs = [spawn(WRITER, url, "hub", w, rounds, B, cap, tmp_path / f"w{w}.log") for w in range(writers)]
    for p in procs:
        assert p.wait(60) == 0
    db = connect(url, "hub")
    acked = {w: len((tmp_path / f"w{w}.log").read_text().split()) for w in range(writers)}
    assert acked == dict.fromkeys(range(writers), rounds)
    stored, ever = db.count_sessions()
    assert ever == writers * rounds * B  # every acknowledged session counted, none twice
    assert stored == cap
    lo, hi = db.session_range()
    assert (lo, hi) == (ever - cap + 1, ever)
    batch = db.get_batch(list(range(lo, hi + 1)))
    assert batch["id"].tolist() == list(range(lo, hi + 1))  # no hole: all the newest `cap` readable
    for w in range(writers):  # a writer's stored sessions are the newest of what it wrote, in its order
        mine = batch["n"][batch["writer"] == w].tolist()
        assert mine == list(range(rounds * B - len(mine), rounds * B))
    db.close()


def test_no_batch_mixes_layouts(url):
    db = connect(url, "mixed")
    a = [encode({"observations": np.full((5, 4), i, np.float32)}) for i in range(30)]
    b = [encode({"observations": np.full((5, 80, 80), i, np.uint8)}) for i in range(30)]
    for i in range(0, 30, 5):
        db._add(a[i : i + 5] + b[i : i + 5], 1000)
    db.layout = db.claim("layout", [["observations", "<f4", [5, 4]]])  # as the first players claim it
    seen = 0
    for _ in range(50):
        batch = db.sample_batch(16)
        assert batch["observations"].shape[1:] == (5, 4)
        assert all((i - 1) // 5 % 2 == 0 for i in batch["id"].tolist())  # ids of layout a only
        seen += len(batch["id"])
    assert seen > 0
    db.close()


def test_params_versions_never_go_backwards(url):
    procs = [spawn(PUSHER, url, "params", 15) for _ in range(3)]
    db, seen = connect(url, "params"), []
    while any(p.poll() is None for p in procs) or not seen:
        if (found := db.load_params()) is not None:
            seen.append(found[0])
            assert (found[1]["w"] == found[0]).all()  # the data that goes with the version
    assert all(p.wait(60) == 0 for p in procs)
    assert seen == sorted(seen)
    assert db.params_version() == 45  # every compare-and-set that won made exactly one version
    db.close()


def test_a_killed_writer_leaves_no_partial_record(url):
    proc = spawn(ENDLESS, url, "killed")
    for _ in range(5):  # some rounds done, the next under way
        assert proc.stdout.readline()
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    db = connect(url, "killed")
    lo, hi = db.session_range()
    assert hi >= 40 and hi % 8 == 0  # whole rounds only
    batch = db.get_batch(list(range(lo, hi + 1)))
    assert len(batch["id"]) == hi - lo + 1 and db.counter("corrupt") == 0
    version, params = db.load_params()
    assert (params["w"] == params["w"][0]).all() and len(params["w"]) == 500_000
    db.close()


def test_params_read_from_a_replica(redis_server, tmp_path):
    port = free_port()
    cmd = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    replica = subprocess.Popen([*cmd, "--replicaof", "127.0.0.1", str(redis_server.port)], cwd=tmp_path,
                               stdout=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_for(lambda: _up(port), 10, "the replica")
        db = connect(f"{redis_server.url}?replica=127.0.0.1:{port}", "rep")
        db.save_params({"w": np.arange(3, dtype=np.float32)})
        wait_for(lambda: db.load_params() is not None, 10, "the params on the replica")
        assert db.load_params()[0] == 1
        redis.Redis(port=port).config_set("replica-read-only", "no")  # what the replica says is what we read
        redis.Redis(port=port).hset("rep:params", "version", 7)
        assert db.load_params()[0] == 7 and db.params_version() == 1  # loads there, versions here
        db.close()
    finally:
        replica.kill()
        replica.wait()


def _up(port):
    try:
        return redis.Redis(port=port, socket_connect_timeout=0.5).ping()
    except redis.ConnectionError:
        return False


def test_replica_url():
    assert _replica("redis://:pw@h:1/2?replica=r:3&ssl_cert_reqs=none") == (
        "redis://:pw@h:1/2?ssl_cert_reqs=none",
        "redis://:pw@r:3/2?ssl_cert_reqs=none",
    )
    assert _replica("redis://h:1/0") == ("redis://h:1/0", None)
    assert _replica("redis://u:pw@h:1/2?replica=r:3&x=1")[1] == "redis://u:pw@r:3/2?x=1"
    assert _replica("rediss://h:1/0?replica=r:3")[1] == "rediss://r:3/0"
    with pytest.raises(DatabaseError, match="replica=HOST:PORT"):
        _replica("redis://h:1/0?replica=nohost")


def test_hub_bench_arithmetic():
    sys.path.insert(0, str(ROOT / "bench"))
    import hub

    cal = {k: {"server_us": 10.0} for k in ("add", "version", "pace", "load", "beat", "episode", "sample", "push")}
    game, train = hub.arithmetic(cal, per_player=8, T=25, steps_per_s=100.0, ups=20.0, save_every=10, key="server_us")
    rounds = 100 / 25 / 8
    assert game == pytest.approx(rounds * 40 + 10 / 16 + rounds * 0.05 * 10)
    assert train == pytest.approx(20 * 10 + 2 * 10 + 5)
