"""The hub at scale: the database load of N games and K trainers, without the learning.

    python bench/hub.py --quick                  # Redis, under 3 minutes: table + one line
    python bench/hub.py --backends redis,sqlite --games 16,32,64 --trainers 2 --seconds 20 \\
        --json bench/results/hub-2cores.jsonl --plot bench/results/hub-2cores.png

Sessions are recorded once by the real player (``play`` of examples/atari.py, Pong, 8 games, and
of examples/dqn.py, CartPole) into a cache file; their stored bytes are replayed. The params are
those of the real Atari network (examples/atari.py's A3C net: 2.7 MB).

Synthetic players (processes, each hosting several players of ``--per-player`` games with a
connection each) replay the recorded bytes at ``--steps-per-s`` agent steps a second a game (a
Pong player's 119), one round of sessions a player per ``session_length`` ticks, and make the
real player's other calls as the real player does: ``sync_params`` every round (the version,
then the params when it moved), the pace's two reads, a heartbeat every 2 s (stop check and
write), and ``count_sessions`` + ``add_metrics`` on a finished episode. The sessions go to the
backend's append as bytes (``add_sessions`` after its encode: the bytes are what a player's
encode made). Synthetic trainers sample ``--batch`` sessions among the newest 64 at ``--ups``
updates a second (``get_batch``, decoded, + the version, as examples/atari.py samples) and
push every ``--save-every`` updates through the real :class:`~tinyverse.params.Publisher`
(compare-and-set, lost races retried), with the pace's flush, metrics and heartbeats.

Two measurements per backend:

- calibration: each operation alone, repeated, on a quiet server: the Redis server's CPU time
  (the redis-server process's, I/O included) and ``INFO commandstats`` time per call, and the
  network bytes in and out per call. This is what carries over to a bigger machine;
- load: every configuration of ``--games`` x ``--trainers`` for ``--seconds``: sessions/s
  stored, batches/s served, params loads/s, p50/p99 of add, sample and load, lost races per
  push, the server's CPU share, bytes per stored transition. On a small machine the clients
  saturate first (games served < games offered); the per-game rates of the calls are what the
  arithmetic takes from it.

The arithmetic: server us per game-second = sum over a player's calls of calls per game-second
x us per call, with a params load every round (10 trainers publishing ~2/s each move the version
faster than a player's ~4.8 rounds/s); the same per trainer; one core serves
(1e6 - K x trainer us) / game us games with K trainers. Redis runs as private servers on free
ports (``--replica`` adds a read replica that ``?replica=`` in the URL sends params reads to),
stopped at the end.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import types
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tinyverse.database import connect  # noqa: E402
from tinyverse.encoding import decode  # noqa: E402
from tinyverse.pace import Pace  # noqa: E402
from tinyverse.params import Publisher, sync_params  # noqa: E402
from tinyverse.settings import Settings  # noqa: E402
from tinyverse.workers import Worker  # noqa: E402

CACHE = Path(tempfile.gettempdir()) / "tinyverse-hub-sessions.db"
GAMES = {"pong": ("examples/atari.py", 8), "cartpole": ("examples/dqn.py", 8)}
HEADS = ["backend", "game", "games", "trainers", "sessions_s", "batches_s", "loads_s", "add_p50_ms", "add_p99_ms",
         "sample_p50_ms", "sample_p99_ms", "load_p50_ms", "load_p99_ms", "lost_per_push", "server_cpu"]  # fmt: skip


# -- recordings ----------------------------------------------------------------------------------
def record(cache: Path = CACHE, rounds: int = 12) -> None:
    """Record sessions with the real player into ``cache`` (once) and the Atari net's params."""
    if cache.exists():
        return
    from tinyverse.loader import load_experiment
    from tinyverse.player import play

    tmp = cache.with_suffix(".part")
    tmp.unlink(missing_ok=True)
    for game, (path, batch) in GAMES.items():
        db = connect(f"sqlite:///{tmp}", game)
        exp = load_experiment(str(ROOT / path), db)
        exp.args.updates_per_step = None  # no trainer here: the player must not wait for one
        play(exp, db, batch_size=batch, rounds=rounds, seed=0, report_every=1e9)
        db.close()
    os.replace(tmp, cache)


def recorded(game: str, cache: Path = CACHE) -> tuple[list[bytes], bytes, int]:
    """(session bytes, params bytes, session length) as the real player stored them."""
    db = connect(f"sqlite:///{cache}", game, create=False)
    lo, hi = db.session_range()
    found = db._get(list(range(lo, hi + 1)))
    blobs = [found[i] for i in sorted(found)]
    version, _, params = db._params(True)
    T = len(decode(blobs[0])["rewards"])
    db.close()
    return blobs, params, T


def episode() -> dict:
    """A finished Pong episode as a player stores it (info and plot skip one without its time and steps)."""
    return {"return": -21.0, "length": 800, "time": time.time(), "steps": 0}


class Holder:
    """What sync_params and Publisher need of an experiment: params, and the pace's settings (its ``run``)."""

    def __init__(self, params: dict, T: int, batch: int = 8):
        self.params = params
        pace = dict(updates_per_step=4.0 / (batch * T), learning_starts=0, pace_slack=64 * T // 2)
        settings = Settings(session_length=T, train_batch_size=batch, **pace)
        self.run = types.SimpleNamespace(settings=settings, updates=0)  # updates: Publisher names a NaN's update

    def get_params(self):
        return self.params

    def set_params(self, params):
        self.params = params


# -- the synthetic workers -----------------------------------------------------------------------
def players(url, prefix, game, n_players, per_player, steps_per_s, seconds, out):
    """``n_players`` players of ``per_player`` games in this process, round-robin on one schedule."""
    blobs, params_blob, T = recorded(game)
    finished = [bool(decode(b)["terminated"].any() or decode(b)["truncated"].any()) for b in blobs]
    every = T / steps_per_s  # seconds between a player's rounds
    ps = []
    for j in range(n_players):
        db = connect(url, prefix)
        exp = Holder(decode(params_blob), T)
        ps.append(dict(db=db, exp=exp, pace=Pace(exp, db), worker=Worker(db, "player"), version=None,
                       next=time.monotonic() + every * j / n_players, i=j * per_player))  # fmt: skip
    add, load, rounds, loads = [], [], 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        p = min(ps, key=lambda q: q["next"])
        if (wait := p["next"] - time.monotonic()) > 0:
            time.sleep(wait)
        p["next"] = max(p["next"] + every, time.monotonic() - every)  # behind: no catching up in bursts
        db, exp = p["db"], p["exp"]
        t0 = time.perf_counter()
        stored = db.params_version()
        if stored is not None and stored != p["version"]:
            p["version"] = sync_params(exp, db, p["version"])
            load.append(time.perf_counter() - t0)
            loads += 1
        p["pace"].player_waits()  # its reads; the wait itself is not kept (nobody learns here)
        idx = [(p["i"] + k) % len(blobs) for k in range(per_player)]
        p["i"] += per_player
        t0 = time.perf_counter()
        db._call(db._add, [blobs[k] for k in idx], 2000)
        add.append(time.perf_counter() - t0)
        if any(finished[k] for k in idx):
            db.count_sessions()
            db.add_metrics(
                "episodes",
                [episode() | {"worker": p["worker"].id}],
            )
        p["worker"].beat(sessions=rounds, version=p["version"])
        rounds += 1
    for p in ps:
        p["worker"].leave()
        p["db"].close()
    out.write_text(json.dumps(dict(rounds=rounds, sessions=rounds * per_player, loads=loads, add=add, load=load)))


def trainer(url, prefix, game, ups, batch, save_every, seconds, out):
    """A trainer without the learning: sample at ``ups`` updates/s, push every ``save_every``."""
    _, params_blob, T = recorded(game)
    db = connect(url, prefix)
    exp = Holder(decode(params_blob), T, batch)
    pace, worker = Pace(exp, db), Worker(db, "trainer")
    publisher = Publisher(exp, db)
    sample, batches, versions, done = [], 0, [], 0
    start = time.monotonic()
    end, last, next_t = start + seconds, start, start
    while time.monotonic() < end:
        if (wait := next_t - time.monotonic()) > 0:
            time.sleep(wait)
        next_t = max(next_t + 1 / ups, time.monotonic() - 1 / ups)
        t0 = time.perf_counter()
        got = db.get_batch(_recent(db.session_range(), batch))
        db.params_version()
        sample.append(time.perf_counter() - t0)
        batches += 1
        pace.count(len(got["rewards"]))
        done += 1
        if done % save_every == 0:
            exp.params = dict(exp.params)
            k = next(iter(exp.params))
            exp.params[k] = exp.params[k] + np.float32(1e-6)  # "trained": one array moved
            versions.append(publisher.push())
        worker.beat(updates=done)
        if time.monotonic() - last >= 2:
            pace.flush()
            db.count_sessions()
            db.add_metrics("train", [{"updates": done, "version": publisher.version}])
            last = time.monotonic()
    worker.leave()
    db.close()
    out.write_text(
        json.dumps(
            dict(batches=batches, pushes=publisher.pushes, lost=publisher.conflicts, sample=sample, versions=versions)
        )  # fmt: skip
    )


def _child(argv):
    kind, args = argv[0], json.loads(argv[1])
    args["out"] = Path(args["out"])
    (players if kind == "players" else trainer)(**args)


# -- servers and measurements --------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A private redis-server on a free port (optionally a replica of another), stopped by PID."""

    def __init__(self, primary: int | None = None):
        self.port, self.dir = free_port(), tempfile.mkdtemp(prefix="hub-redis-")
        cmd = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", self.dir, "--maxmemory", "4gb"]  # fmt: skip
        if primary:
            cmd += ["--replicaof", "127.0.0.1", str(primary)]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        import redis

        self.r = redis.Redis(port=self.port)
        for _ in range(100):
            try:
                self.r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)

    def cpu(self) -> float:
        """Seconds of CPU the server has used (user + system), from /proc."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def net(self) -> tuple[int, int]:
        s = self.r.info("stats")
        return s["total_net_input_bytes"], s["total_net_output_bytes"]

    def commandstats(self) -> dict:
        return {k.removeprefix("cmdstat_"): v for k, v in self.r.info("commandstats").items()}

    def stop(self):
        self.r.close()
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)


def ms(xs, q):
    return round(float(np.percentile(xs, q)) * 1000, 3) if len(xs) else None


def calibrate(url: str, server, game: str, per_player: int, batch: int, seconds: float, replica=None) -> dict:
    """Each operation alone for ``seconds``: server CPU us, commandstats us and bytes in/out per call."""
    blobs, params_blob, T = recorded(game)
    prefix = f"cal-{uuid.uuid4().hex[:8]}"
    db = connect(url, prefix)
    exp = Holder(decode(params_blob), T, batch)
    db.save_params(exp.params)
    db._call(db._add, blobs[:64] * 2, 2000)
    pace, worker = Pace(exp, db), Worker(db, "player")
    ops = {
        "add": lambda i: db._call(db._add, [blobs[(i * per_player + k) % len(blobs)] for k in range(per_player)], 2000),
        "version": lambda i: db.params_version(),
        "pace": lambda i: pace.player_waits(),
        "beat": lambda i: worker.beat(force=True),
        "load": lambda i: db.load_params(),
        "sample": lambda i: (db.get_batch(_recent(db.session_range(), batch)), db.params_version()),
        "push": lambda i: (db.params_version(), db.save_params(exp.params, expect=db.params_version() or 0)),
        "episode": lambda i: (
            db.count_sessions(),
            db.add_metrics("episodes", [episode()]),
        ),
    }
    out = {}
    for name, fn in ops.items():
        for i in range(5):
            fn(i)
        if server:
            server.r.config_resetstat()  # it resets the network counters too: read them after
        t0, (i0, o0) = time.perf_counter(), server.net() if server else (0, 0)
        c0, reps = server.cpu() if server else 0.0, 0
        r0, (_, ro0) = (replica.cpu(), replica.net()) if replica else (0.0, (0, 0))
        while time.perf_counter() - t0 < seconds:  # the server's CPU clock ticks in 10 ms: run long enough
            fn(reps)
            reps += 1
        wall = time.perf_counter() - t0
        row = {"calls": reps, "client_ms": round(wall / reps * 1000, 4)}
        if server:
            c1, (i1, o1) = server.cpu(), server.net()
            stats = server.commandstats()
            row["server_us"] = round((c1 - c0) / reps * 1e6, 2)
            top = [k for k in stats if k not in ("config", "info")]
            row["cmdstat_us"] = round(sum(stats[k]["usec"] for k in top if not _inner(k, stats)) / reps, 2)
            row["cmds"] = {k: round(stats[k]["calls"] / reps, 2) for k in top}
            row["in_bytes"], row["out_bytes"] = round((i1 - i0) / reps), round((o1 - o0) / reps)
        if replica:
            r1, (_, ro1) = replica.cpu(), replica.net()
            row["replica_us"], row["replica_out_bytes"] = round((r1 - r0) / reps * 1e6, 2), round((ro1 - ro0) / reps)
        out[name] = row
    worker.leave()
    db.clear(sessions=True, params=True, workers=True, metrics=True)
    db.close()
    return out


def _recent(span: tuple[int, int], batch: int) -> list[int]:
    lo, hi = max(span[0], span[1] - 63), span[1]
    return np.random.default_rng().choice(np.arange(lo, hi + 1), batch, replace=False).tolist()


def _inner(name: str, stats: dict) -> bool:
    """Calls made inside a Lua script are counted by commandstats too: count the script's time once."""
    return "evalsha" in stats and name in ("hset", "hdel", "incr", "incrby", "get", "set", "sadd", "hget", "hexists")


def arithmetic(cal: dict, per_player: int, T: int, steps_per_s: float, ups: float, save_every: int, key: str):
    """Server us per game-second and per trainer-second from the calibration; games one core serves."""
    rounds = steps_per_s / T / per_player  # a player's rounds per second, per game
    beats = 1 / 2.0 / per_player
    game = rounds * (cal["add"][key] + cal["version"][key] + cal["pace"][key] + cal["load"][key])
    game += beats * cal["beat"][key] + rounds * 0.05 * cal["episode"][key]  # Pong: an episode ends every ~20 rounds
    train = ups * cal["sample"][key] + ups / save_every * cal["push"][key] + 0.5 * cal["beat"][key]
    return game, train


def bandwidth(cal: dict, per_player, T, steps_per_s, ups, save_every, games, trainers):
    """(in, out) bytes a second of the hub for ``games`` and ``trainers``, by kind."""
    rounds = games * steps_per_s / T / per_player
    kinds = {
        "sessions": (rounds * cal["add"]["in_bytes"], rounds * cal["add"]["out_bytes"]),
        "params": (rounds * cal["load"]["in_bytes"] + trainers * ups / save_every * cal["push"]["in_bytes"],
                   rounds * cal["load"]["out_bytes"] + trainers * ups / save_every * cal["push"]["out_bytes"]),
        "batches": (trainers * ups * cal["sample"]["in_bytes"], trainers * ups * cal["sample"]["out_bytes"]),
    }  # fmt: skip
    return kinds


def load_run(url, server, game, games, trainers, a) -> dict:
    prefix = f"hub-{uuid.uuid4().hex[:8]}"
    blobs, params_blob, T = recorded(game)
    db = connect(url, prefix)
    db.set_capacity(2000)
    db.save_params(decode(params_blob))
    db._call(db._add, blobs[:64], 2000)
    n_players = max(1, games // a.per_player)
    procs_n = min(a.procs, n_players)
    tmp = Path(tempfile.mkdtemp(prefix="hub-run-"))
    children = []
    warm = 2.0
    for j in range(procs_n):
        mine = n_players // procs_n + (j < n_players % procs_n)
        args = dict(url=url, prefix=prefix, game=game, n_players=mine, per_player=a.per_player,
                    steps_per_s=a.steps_per_s, seconds=a.seconds + warm, out=str(tmp / f"p{j}.json"))  # fmt: skip
        children.append(subprocess.Popen([sys.executable, __file__, "--child", "players", json.dumps(args)]))
    for j in range(trainers):
        args = dict(url=url, prefix=prefix, game=game, ups=a.ups, batch=a.batch, save_every=a.save_every,
                    seconds=a.seconds + warm, out=str(tmp / f"t{j}.json"))  # fmt: skip
        children.append(subprocess.Popen([sys.executable, __file__, "--child", "trainer", json.dumps(args)]))
    time.sleep(warm + 1.0)  # imports and connections first
    c0, n0 = (server.cpu(), server.net()) if server else (0.0, (0, 0))
    s0 = db.count_sessions()[1]
    t0 = time.monotonic()
    for c in children:
        c.wait()
    wall = time.monotonic() - t0
    c1, n1 = (server.cpu(), server.net()) if server else (0.0, (0, 0))
    s1 = db.count_sessions()[1]
    ps = [json.loads((tmp / f"p{j}.json").read_text()) for j in range(procs_n)]
    ts = [json.loads((tmp / f"t{j}.json").read_text()) for j in range(trainers)]
    seconds = a.seconds + warm  # the workers' own span, for their counts
    add = [x for p in ps for x in p["add"]]
    load = [x for p in ps for x in p["load"]]
    sample = [x for t in ts for x in t["sample"]]
    pushes = sum(t["pushes"] for t in ts)
    stored = db.count_sessions()[0]
    if server:
        per_transition = server.r.memory_usage(f"{prefix}:sessions", samples=0) / stored / T
    else:
        per_transition = os.path.getsize(db.path) / stored / T
    row = dict(
        backend=url.split(":")[0], game=game, games=n_players * a.per_player, trainers=trainers,
        sessions_s=round((s1 - s0) / wall, 1), batches_s=round(sum(t["batches"] for t in ts) / seconds, 1),
        loads_s=round(sum(p["loads"] for p in ps) / seconds, 1), add_p50_ms=ms(add, 50), add_p99_ms=ms(add, 99),
        sample_p50_ms=ms(sample, 50), sample_p99_ms=ms(sample, 99), load_p50_ms=ms(load, 50),
        load_p99_ms=ms(load, 99), lost_per_push=round(sum(t["lost"] for t in ts) / max(pushes, 1), 3),
        server_cpu=round((c1 - c0) / wall, 3) if server else None, bytes_per_transition=round(per_transition),
        offered_sessions_s=round(n_players * a.per_player * a.steps_per_s / T, 1),
        net_in_MBs=round((n1[0] - n0[0]) / wall / 1e6, 2), net_out_MBs=round((n1[1] - n0[1]) / wall / 1e6, 2),
    )  # fmt: skip
    row["games_served"] = round(row["sessions_s"] / (a.steps_per_s / T), 1)
    db.clear(sessions=True, params=True, workers=True, metrics=True)
    db.close()
    shutil.rmtree(tmp, ignore_errors=True)
    return row


def table(rows: list[dict], heads: list[str]) -> str:
    cells = [[str(r.get(h, "")) for h in heads] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(cell, widths, strict=True)) for cell in cells]
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for key in sorted({(r["backend"], r.get("label", ""), r["trainers"]) for r in rows if "games_served" in r}):
        pts = sorted((r["games"], r["games_served"]) for r in rows if (r["backend"], r.get("label", ""),
                                                                       r["trainers"]) == key)  # fmt: skip
        ax.plot(*zip(*pts, strict=True), "o-", label=f"{key[0]} {key[1]} {key[2]} trainers".replace("  ", " "))
    top = max(r["games"] for r in rows if "games" in r)
    ax.plot([0, top], [0, top], "k:", label="all served")
    ax.set_xlabel("Pong games offered")
    ax.set_ylabel("games served (sessions stored / a game's rate)")
    ax.set_title("one hub, synthetic players and trainers (bench/hub.py)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="Redis, 16 and 48 games, 2 trainers, 12 s: under 3 min")
    ap.add_argument("--backends", default="redis", help="redis,sqlite")
    ap.add_argument("--game", default="pong", choices=sorted(GAMES))
    ap.add_argument("--games", default="16,32,64", help="games offered, comma-separated")
    ap.add_argument("--trainers", default="2", help="trainers, comma-separated")
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--per-player", type=int, default=8, help="games a player runs (Pong's player: 8)")
    ap.add_argument("--procs", type=int, default=2, help="processes the players are spread over")
    ap.add_argument("--steps-per-s", type=float, default=119.0, help="agent steps a second a game (Pong: 119)")
    ap.add_argument("--ups", type=float, default=19.0, help="updates a second a trainer (Pong: 19)")
    ap.add_argument("--batch", type=int, default=8, help="sessions an update (Pong: 8)")
    ap.add_argument("--save-every", type=int, default=10, help="updates between pushes (examples/atari.py: 10)")
    ap.add_argument("--cal-seconds", type=float, default=2.0, help="seconds each operation runs alone")
    ap.add_argument("--target", default="1000,10", help="games,trainers the arithmetic is held against")
    ap.add_argument("--replica", action="store_true", help="Redis: params reads from a read replica (?replica=)")
    ap.add_argument("--label", default="", help="a name for these rows (before, after, ...)")
    ap.add_argument("--json", help="append the rows to this JSONL file")
    ap.add_argument("--plot", help="draw games served vs offered from the --json file into this PNG")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        return _child(a.child)
    if a.quick:
        a.games, a.trainers, a.seconds, a.cal_seconds = "16,48", "2", 12.0, 1.5
    record()
    blobs, params_blob, T = recorded(a.game)
    print(f"{a.game}: {len(blobs)} recorded sessions of {T} ticks, {np.mean([len(b) for b in blobs]) / 1e3:.1f} kB "
          f"each stored; params {len(params_blob) / 1e6:.2f} MB")  # fmt: skip
    target_games, target_trainers = (int(x) for x in a.target.split(","))
    rows, servers, lines = [], [], []
    try:
        for backend in a.backends.split(","):
            server = rep = None
            if backend == "redis":
                server = Server()
                servers.append(server)
                url = f"redis://127.0.0.1:{server.port}/0"
                if a.replica:
                    rep = Server(server.port)
                    servers.append(rep)
                    url += f"?replica=127.0.0.1:{rep.port}"
            else:
                url = f"sqlite:///{tempfile.mkdtemp(prefix='hub-sqlite-')}/hub.db"
            cal = calibrate(url, server, a.game, a.per_player, a.batch, a.cal_seconds, rep)
            cal_row = dict(kind="calibration", backend=backend, game=a.game, label=a.label, ops=cal)
            rows.append(cal_row)
            keys = ["calls", "client_ms"] + (["server_us", "cmdstat_us", "in_bytes", "out_bytes"] if server else [])
            keys += ["replica_us", "replica_out_bytes"] if rep else []
            print(f"\n{backend}: each operation alone for {a.cal_seconds:g} s")
            print(table([{"op": k, **v} for k, v in cal.items()], ["op", *keys]))
            for trainers in (int(x) for x in a.trainers.split(",")):
                for games in (int(x) for x in a.games.split(",")):
                    row = load_run(url, server, a.game, games, trainers, a)
                    row |= dict(kind="load", label=a.label, seconds=a.seconds)
                    rows.append(row)
                    print(f"\n{backend}: {games} games, {trainers} trainers, {a.seconds:.0f} s")
                    print(table([row], HEADS[4:] + ["bytes_per_transition", "net_in_MBs", "net_out_MBs"]))
            if server:
                for key in ("server_us", "cmdstat_us"):
                    g, t = arithmetic(cal, a.per_player, T, a.steps_per_s, a.ups, a.save_every, key)
                    at = (target_games * g + target_trainers * t) / 1e6
                    n = int((1e6 - target_trainers * t) / g)
                    k = int((1e6 - target_games * g) / t) if at < 1 else 0
                    cal_row[f"game_{key}"], cal_row[f"trainer_{key}"] = round(g, 1), round(t, 1)
                    cal_row[f"core_share_{key}"], cal_row[f"games_per_core_{key}"] = round(at, 3), n
                    lines.append(
                        f"by {key}: a Pong game costs {g:.0f} us of server a second, a trainer {t:.0f}; "
                        f"{target_games} games + {target_trainers} trainers take {at:.2f} of a core "
                        f"(headroom {1 / at:.1f}x); with {target_trainers} trainers a core takes {n} games, "
                        f"with {target_games} games {k} trainers"
                    )
                kinds = bandwidth(cal, a.per_player, T, a.steps_per_s, a.ups, a.save_every, target_games,
                                  target_trainers)  # fmt: skip
                cal_row["bandwidth_Bs"] = kinds
                total_out = sum(v[1] for v in kinds.values())
                total_in = sum(v[0] for v in kinds.values())
                peak = max(total_in, total_out)
                parts = ", ".join(f"{k} {v[0] / 1e6:.0f}/{v[1] / 1e6:.0f}" for k, v in kinds.items())
                lines.append(
                    f"network at {target_games} games + {target_trainers} trainers, MB/s in/out: {parts}; "
                    f"total {total_in / 1e6:.0f}/{total_out / 1e6:.0f} = "
                    f"{peak / 125e6:.2f} of 1 GbE, {peak / 1250e6:.2f} of 10 GbE"
                )
                if rep:
                    rounds = a.steps_per_s / T / a.per_player  # a load a round
                    per_core = int(1e6 / (rounds * cal["load"]["replica_us"]))
                    out = target_games * rounds * cal["load"]["replica_out_bytes"]
                    cal_row["games_per_replica_core"] = per_core
                    lines.append(
                        f"a read replica core serves the params loads of {per_core} games; at {target_games} games "
                        f"they are {out / 1e6:.0f} MB/s: {out / 1250e6:.2f} of 10 GbE"
                    )
                g, t = cal_row["game_server_us"], cal_row["trainer_server_us"]
                n = int((1e6 - target_trainers * t) / g)
                lines.append(f"one Redis core serves {n} Pong games and {target_trainers} trainers")
    finally:
        for s in reversed(servers):
            s.stop()
    print()
    print("\n".join(lines))
    if a.json:
        with open(a.json, "a") as f:
            for r in rows:
                f.write(json.dumps(r) + "\n")
    if a.plot and a.json:
        plot([json.loads(x) for x in open(a.json)], a.plot)


if __name__ == "__main__":
    main()
