"""Replay at scale: add and sample throughput of both backends, 10^3 to 10^6 stored sessions.

    python bench/replay.py                                   # CartPole 1e3..1e6, Atari 1e3..1e5
    python bench/replay.py --sizes 1e3,1e4 --atari-sizes 1e3 --backends sqlite --seconds 1

For each backend and payload, the ring is filled to each size (with pre-encoded sessions, fast)
and then timed through the public API, encoding and decoding included:

- add: ``add_sessions`` of ``--add-batch`` sessions a call (a player with -b 8), ring full, so each
  append also evicts;
- sample: ``sample_batch(--sample-batch)``, the trainer's default: sessions drawn uniformly and
  decoded into stacked arrays, ready to train on;
- get: ``session_range()`` + ``get_batch(ids)`` of random ids (the path of prioritized replay).

Next to them, in turns with them (a tenth of a second each, so that a busy machine's load falls on both
alike), raw redis-py on the same server: pipelined SET of ``--add-batch`` values of the same byte size per
round trip; for sampling from Redis an HMGET of ``--sample-batch`` random ids of the same ring (the same
bytes), for SQLite an MGET of as many values of the same size. The ratio is tinyverse / raw. Raw bytes are
not arrays yet: the ratio charges tinyverse for decoding (and, for Atari frames, for inflating them) but not
raw Redis. Each sample line also splits a batch's time: the fetch (``_sample``; the Redis server's time of it
from INFO commandstats, every client's) and decoding and stacking. For Atari a line gives raw SET and MGET
of the frames uncompressed (values the size of the arrays), what storing them without a codec would cost.
Also printed: bytes stored per transition (Redis MEMORY USAGE of the ring, SQLite file size) and
what zlib compression buys Atari frames (size, encode and decode time vs raw).

Payloads: a CartPole session is what a player of examples/dqn.py records (16 ticks of 4 float32);
an Atari session is 25 ticks of 84x84 uint8 frames, one frame per tick (real Pong frames when
ale-py is installed, else synthetic ones), with the zero-filled final observations a player
stores. Redis runs on a private prefix of the given database, deleted at the end; the script
stops growing a ring that would push Redis past ``--redis-max-gb``.
"""

import argparse
import itertools
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import tinyverse.encoding as encoding  # noqa: E402
from tinyverse.database import connect  # noqa: E402


def cartpole_session(rng, T=16) -> dict:
    obs = rng.normal(size=(T + 1, 4)).astype(np.float32)
    done = np.zeros(T, bool)
    return {
        "observations": obs,
        "final_observations": np.zeros((T, 4), np.float32),
        "actions": rng.integers(0, 2, T).astype(np.int64),
        "rewards": np.ones(T, np.float32),
        "terminated": done,
        "truncated": done.copy(),
        "version": np.int64(7),
        "worker": np.int64(12345),
        "info.epsilon": np.float64(0.05),
    }


def atari_frames(n: int, rng) -> tuple[np.ndarray, str]:
    """``n`` 84x84 grayscale frames: Pong under random actions if ale-py is there, else synthetic."""
    try:
        import ale_py
        import gymnasium as gym

        gym.register_envs(ale_py)
        env = gym.make("ALE/Pong-v5", obs_type="grayscale")
        env.reset(seed=0)
        rows, cols = np.linspace(0, 209, 84).astype(int), np.linspace(0, 159, 84).astype(int)
        frames = []
        while len(frames) < n:
            o, _, term, trunc, _ = env.step(env.action_space.sample())
            frames.append(o[rows][:, cols])  # nearest-neighbour resize, no OpenCV needed
            if term or trunc:
                env.reset()
        env.close()
        return np.stack(frames), "Pong frames"
    except Exception:  # no ale-py: flat background, a few moving blocks, a little noise
        frames = np.full((n, 84, 84), 87, np.uint8)
        for i in range(n):
            for k in range(3):
                y, x = (7 * i + 20 * k) % 76, (5 * i + 30 * k) % 80
                frames[i, y : y + 8, x : x + 4] = 236
        frames[:, :10] = rng.integers(0, 255, (n, 10, 84), dtype=np.uint8) // 64 * 64
        return frames, "synthetic frames"


def atari_sessions(n: int, rng, T=25) -> tuple[list[dict], str]:
    frames, kind = atari_frames(n * T + 1, rng)
    sessions = []
    for i in range(n):
        s = cartpole_session(rng, T)
        s["observations"] = frames[i * T : i * T + T + 1]
        s["final_observations"] = np.zeros((T, 84, 84), np.uint8)
        s["actions"] = rng.integers(0, 6, T).astype(np.int64)
        sessions.append(s)
    return sessions, kind


def timed(fn, seconds: float, min_calls: int = 3) -> float:
    """Calls per second of ``fn`` over about ``seconds``."""
    calls, start = 0, time.perf_counter()
    while calls < min_calls or time.perf_counter() - start < seconds:
        fn()
        calls += 1
    return calls / (time.perf_counter() - start)


def compression_report(sessions: list[dict], repeat: int = 20) -> str:
    def measure():
        blobs = [encoding.encode(s) for s in sessions]
        enc = timed(lambda: [encoding.encode(s) for s in sessions], 0.5, repeat)
        dec = timed(lambda: [encoding.decode(b) for b in blobs], 0.5, repeat)
        size = np.mean([len(b) for b in blobs])
        return size, 1e6 / (enc * len(sessions)), 1e6 / (dec * len(sessions))

    raw_bytes = np.mean([sum(a.nbytes for a in s.values()) for s in sessions])
    zipped = measure()
    saved = encoding.COMPRESS_MIN_BYTES
    encoding.COMPRESS_MIN_BYTES = 1 << 62  # compression off
    try:
        plain = measure()
    finally:
        encoding.COMPRESS_MIN_BYTES = saved
    return (
        f"Atari session ({raw_bytes / 1024:.0f} KiB of arrays): raw codec {plain[0] / 1024:.0f} KiB, "
        f"encode {plain[1]:.0f} us, decode {plain[2]:.0f} us | zlib-1 {zipped[0] / 1024:.1f} KiB "
        f"({plain[0] / zipped[0]:.1f}x smaller), encode {zipped[1]:.0f} us, decode {zipped[2]:.0f} us"
    )


class Raw:
    """Raw redis-py on ``n`` keys holding values of the payload's size."""

    def __init__(self, r: redis.Redis, prefix: str, blob: bytes, n: int = 1000):
        self.r, self.keys, self.blob = r, [f"{prefix}:raw:{i}" for i in range(n)], blob
        with r.pipeline(transaction=False) as p:
            for k in self.keys:
                p.set(k, blob)
            p.execute()
        self.next = 0

    def add(self, batch: int) -> None:
        with self.r.pipeline(transaction=False) as p:
            for _ in range(batch):
                p.set(self.keys[self.next % len(self.keys)], self.blob)
                self.next += 1
            p.execute()

    def get(self, batch: int, rng) -> None:
        self.r.mget([self.keys[i] for i in rng.integers(0, len(self.keys), batch)])


def fill(db, blobs: list[bytes], n: int, chunk: int) -> None:
    """Grow the ring to ``n`` sessions with pre-encoded blobs (the backend primitive, no encoding)."""
    db.set_capacity(n)
    stored = db.count_sessions()[0]
    i = 0
    while stored < n:
        k = min(chunk, n - stored)
        db._call(db._add, [blobs[(i + j) % len(blobs)] for j in range(k)], n)
        stored += k
        i += k


def stored_bytes(db, r: redis.Redis | None) -> int:
    if r is not None:
        return int(r.memory_usage(f"{db.prefix}:sessions", samples=1000) or 0)
    db.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return sum(os.path.getsize(p) for p in (db.path, db.path + "-wal") if os.path.exists(p))


def alternated(fns: dict, seconds: float, r: redis.Redis, turns: int = 20) -> dict[str, tuple[float, float]]:
    """Calls per second of each of ``fns`` and Redis server microseconds per call (INFO commandstats,
    every client's), the functions run in turns one after the other, each turn about
    ``seconds / turns``: a busy machine's load falls on each alike."""
    calls, spent, server = dict.fromkeys(fns, 0), dict.fromkeys(fns, 0.0), dict.fromkeys(fns, 0.0)
    for _ in range(turns):
        for name, fn in fns.items():
            before = server_us(r)
            start, n = time.perf_counter(), 0
            while n < 3 or time.perf_counter() - start < seconds / turns:
                fn()
                n += 1
            spent[name] += time.perf_counter() - start
            calls[name] += n
            server[name] += server_us(r) - before
    return {name: (calls[name] / spent[name], server[name] / calls[name]) for name in fns}


def server_us(r: redis.Redis) -> float:
    """Microseconds the server spent on commands so far (INFO and CONFIG left out)."""
    stats = r.info("commandstats")
    return sum(v["usec"] for k, v in stats.items() if k not in ("cmdstat_info", "cmdstat_config"))


def bench(backend, url, payload, sessions, sizes, raw, args, r) -> list[list[str]]:
    rng = np.random.default_rng(0)
    blobs = [encoding.encode(s) for s in sessions]
    size_b = float(np.mean([len(b) for b in blobs]))
    T = len(sessions[0]["rewards"])
    B = args.sample_batch
    prefix = f"bench-replay-{uuid.uuid4().hex[:8]}"
    db = connect(url, prefix, retry_for=10)
    rows = []
    try:
        for n in sizes:
            if backend == "redis":
                used = int(r.info("memory")["used_memory"])
                if used + (n - db.count_sessions()[0]) * size_b * 1.2 > args.redis_max_gb * 2**30:
                    print(f"  {backend} {payload}: stopping before {n:,} sessions (Redis would pass --redis-max-gb)")
                    break
            t0 = time.perf_counter()
            fill(db, blobs, n, max(1, int(2**24 // size_b)))
            filled = time.perf_counter() - t0
            per_transition = stored_bytes(db, r if backend == "redis" else None) / (n * T)
            turn = iter(range(10**12))

            def add(turn=turn, n=n):
                db.add_sessions([sessions[next(turn) % len(sessions)] for _ in range(args.add_batch)], n)

            def get():
                lo, hi = db.session_range()
                db.get_batch(rng.integers(lo, hi + 1, B).tolist())

            rate = alternated({"add": add, "raw add": lambda: raw.add(args.add_batch)}, args.seconds, r)
            add_s, raw_add = rate["add"][0] * args.add_batch, rate["raw add"][0] * args.add_batch
            db.sample_batch(B)  # the Redis sampler learns the range: its steady state is timed
            lo, hi = db.session_range()  # after the adds, which turned the ring over
            # ids drawn beforehand, 4,096 batches of them: more than a ring of 10^5 holds, so that the server's
            # caches favour neither side; drawn after the adds (before them, raw fetched evicted ids: nothing)
            drawn = itertools.cycle(rng.integers(lo, hi + 1, (4096, B)).tolist())
            if backend == "redis":  # the same bytes: the ring's hash, as many random ids
                raw_get = lambda: r.hmget(f"{prefix}:sessions", next(drawn))  # noqa: E731, B023
            else:  # no ring in Redis: values of the same size under 1,000 keys
                raw_get = lambda: raw.get(B, rng)  # noqa: E731
            if backend == "redis":
                assert None not in r.hmget(f"{prefix}:sessions", list(range(lo, hi + 1))[:1000]), "raw would miss"
            parts = {"sample": lambda: db.sample_batch(B), "raw": raw_get}
            parts["fetch"] = lambda: db._call(db._sample, B) if hasattr(db, "_sample") else None  # older trees: none
            rate = alternated(parts, args.seconds, r)
            us = {k: 1e6 / v[0] for k, v in rate.items()}
            sample_s, raw_s = rate["sample"][0] * B, rate["raw"][0] * B
            print(  # decoding fresh rows costs more than decoding one batch again and again: it is the difference
                f"  {backend} {payload} {n:,}: a batch of {B} {us['sample']:.0f} us = fetch {us['fetch']:.0f}"
                f" (Redis {rate['fetch'][1]:.0f}) + decode and stack {us['sample'] - us['fetch']:.0f}; raw"
                f" {'HMGET of the ring' if backend == 'redis' else 'MGET'} {us['raw']:.0f} us"
                f" (Redis {rate['raw'][1]:.0f}); sample vs raw {sample_s / raw_s:.2f}",
                flush=True,
            )
            get_s = timed(get, args.seconds) * B
            mb = size_b / 2**20
            rows.append(
                [
                    backend,
                    payload,
                    f"{n:,}",
                    f"{add_s:,.0f}",
                    f"{add_s * mb:,.1f}",
                    f"{raw_add:,.0f}",
                    f"{add_s / raw_add:.2f}",
                    f"{sample_s:,.0f}",
                    f"{sample_s * mb:,.1f}",
                    f"{raw_s:,.0f}",
                    f"{sample_s / raw_s:.2f}",
                    f"{get_s:,.0f}",
                    f"{per_transition:,.0f}",
                    f"{filled:.0f}",
                ]
            )
            print("  " + " | ".join(rows[-1]), flush=True)
    finally:
        db.clear(sessions=True, params=True, workers=True, metrics=True)
        if backend == "redis":
            keys = list(r.scan_iter(match=f"{prefix}:*", count=1000))
            if keys:
                r.unlink(*keys)
            r.srem("tinyverse:namespaces", prefix)
        db.close()
    return rows


def table(rows: list[list[str]]) -> str:
    head = [
        "backend",
        "payload",
        "stored",
        "add/s",
        "add MB/s",
        "raw add/s",
        "add vs raw",
        "sample/s",
        "sample MB/s",
        "raw sample/s",
        "sample vs raw",
        "get/s",
        "B/transition",
        "fill s",
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]
    line = lambda cells: "| " + " | ".join(str(c).rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"  # noqa: E731
    return "\n".join([line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)])


def sizes_arg(text: str) -> list[int]:
    return [int(float(x)) for x in text.split(",") if x]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=sizes_arg, default=sizes_arg("1e3,1e4,1e5,1e6"), help="CartPole ring sizes")
    p.add_argument("--atari-sizes", type=sizes_arg, default=sizes_arg("1e3,1e4,1e5"), help="Atari ring sizes")
    p.add_argument("--backends", default="sqlite,redis", help="comma-separated: sqlite, redis")
    p.add_argument("--redis", default="redis://127.0.0.1:6379/15", help="Redis URL (a private prefix is used)")
    p.add_argument("--redis-max-gb", type=float, default=8.0, help="never push Redis memory past this")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds each measurement runs")
    p.add_argument("--add-batch", type=int, default=8, help="sessions per add call")
    p.add_argument("--sample-batch", type=int, default=32, help="sessions per sample call")
    p.add_argument("--dir", help="directory for the SQLite files (default: a fresh temporary one)")
    args = p.parse_args()

    rng = np.random.default_rng(0)
    cart = [cartpole_session(rng) for _ in range(64)]
    atari, kind = atari_sessions(16, rng)
    print(compression_report(atari[:4]) + f" [{kind}]")
    r = redis.Redis.from_url(args.redis)
    r.ping()  # the raw figures need Redis even for a SQLite-only run
    raw_prefix = f"bench-replay-raw-{uuid.uuid4().hex[:8]}"
    workdir = Path(args.dir or tempfile.mkdtemp(prefix="tinyverse-replay-"))
    rows = []
    try:
        for payload, sessions, sizes in (("cartpole", cart, args.sizes), ("atari", atari, args.atari_sizes)):
            if not sizes:
                continue
            size = len(encoding.encode(sessions[0]))
            raw = Raw(r, f"{raw_prefix}-{payload}", encoding.encode(sessions[0]))
            print(f"{payload}: {size:,} B a session encoded")
            if payload == "atari":  # the same arrays stored without a codec
                plain = b"x" * sum(a.nbytes for a in sessions[0].values())
                unzipped = Raw(r, f"{raw_prefix}-{payload}-plain", plain, n=200)
                plain_add = timed(lambda: unzipped.add(args.add_batch), args.seconds) * args.add_batch  # noqa: B023
                plain_get = timed(lambda: unzipped.get(args.sample_batch, rng), args.seconds) * args.sample_batch  # noqa: B023
                print(f"  uncompressed ({len(plain):,} B): raw SET {plain_add:,.0f}/s, MGET {plain_get:,.0f}/s")
            for backend in args.backends.split(","):
                if backend == "sqlite":
                    url = f"sqlite:///{workdir / f'{payload}.db'}"
                else:
                    url = args.redis
                rows += bench(backend, url, payload, sessions, sizes, raw, args, r)
                if backend == "sqlite":
                    for f in workdir.glob(f"{payload}.db*"):
                        f.unlink()
    finally:
        keys = list(r.scan_iter(match=f"{raw_prefix}*", count=1000))
        if keys:
            r.unlink(*keys)
    print()
    print(table(rows))
    print(
        "\nadd/s, sample/s, get/s: sessions per second (sample = sample_batch, stacked;"
        " get = session_range + get_batch, prioritized replay's path); MB/s of encoded"
        " sessions; raw: redis-py run in turns with tinyverse (pipelined SET"
        f" x{args.add_batch} of values of the same size; for Redis an HMGET x{args.sample_batch} of"
        " the ring itself, ids drawn beforehand, for SQLite an MGET of values of the same size);"
        " B/transition: stored bytes / (sessions x ticks)"
    )


if __name__ == "__main__":
    main()
