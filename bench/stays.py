"""Does CartPole stay solved? A fleet trains for a fixed time, then its params face a final greedy eval.

    python bench/stays.py                           # 3 runs of 210 s: 2 x play -b 4, train -b 32
    python bench/stays.py --kills 10                # and 10 random kill -9 of workers during each run
    python bench/stays.py --kills 10 --kill trainer # only of the trainer
    python bench/stays.py --set learning_rate=1e-3 --out rows.jsonl   # options of cartpole_dqn.py

The fleet of ``examples/cartpole_dqn.py`` (real subprocesses on a fresh SQLite file) runs for
``--seconds`` of training clock and never stops early: solving once is not the question, staying
solved is. Every ``--eval-every-s`` seconds all workers are paused (SIGSTOP), this process loads the
newest params and plays 20 greedy episodes, and the workers go on (SIGCONT): evals are not on the
clock. ``--kills N`` kills a random worker with SIGKILL at N random moments and starts it again at
once, as ``run`` would (``--kill trainer`` or ``player``: only those). At the end the workers stop
warmly (SIGINT: the trainer publishes) and the stored params play the final 20-episode eval; the bar
is a final eval >= 475 in every run.
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import atari_learn  # noqa: E402
from cartpole import EXAMPLE, SOLVED, evaluate, greedy  # noqa: E402

from tinyverse import sync_params  # noqa: E402
from tinyverse.database import connect  # noqa: E402
from tinyverse.loader import load_experiment  # noqa: E402


def run(seed: int, seconds: float, kills: int, eval_every: float, options: list[str], buffer: int = 0, kill="") -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-stays-"))
    env = {k: v for k, v in os.environ.items() if k != "TINYVERSE_DB"}
    cmd, sets = [sys.executable, "-m", "tinyverse", str(EXAMPLE)], [a for o in options for a in ("--set", o)]
    sets += ["--buffer-size", str(buffer)] if buffer else []
    argvs = {f"player-{i}": [*cmd, "play", "-b", "4", "--seed", str(100 * seed + i), *sets] for i in range(2)}
    argvs["trainer"] = [*cmd, "train", "-b", "32", *sets]
    rng = random.Random(seed)
    kill_at = sorted(rng.uniform(0.05 * seconds, 0.9 * seconds) for _ in range(kills))
    procs = {}

    def start(name):
        index = {"TINYVERSE_WORKER_INDEX": name[-1], "TINYVERSE_WORKER_COUNT": "2"} if "player" in name else {}
        log = open(workdir / f"{name}.log", "a")
        procs[name] = subprocess.Popen(argvs[name], cwd=workdir, env={**env, **index}, stderr=log, stdout=log)

    for name in argvs:
        start(name)
    begin, paused, curve, killed = time.monotonic(), 0.0, [], []
    try:
        db = connect(f"sqlite:///{workdir / 'tinyverse.db'}", EXAMPLE.stem, retry_for=30)
        exp, version = load_experiment(str(EXAMPLE), db, dict(o.split("=", 1) for o in options)), None
        while (clock := time.monotonic() - begin - paused) < seconds:
            time.sleep(min(0.5, seconds - clock))
            clock = time.monotonic() - begin - paused
            while kill_at and kill_at[0] <= clock:
                kill_at.pop(0)
                name = rng.choice(sorted(n for n in procs if kill in n))
                procs[name].kill()
                procs[name].wait()
                killed.append((round(clock, 1), name))
                start(name)
            if clock >= eval_every * (len(curve) + 1):
                stop = time.monotonic()
                for p in procs.values():
                    p.send_signal(signal.SIGSTOP)
                try:
                    version = sync_params(exp, db, version)
                    if version is not None:
                        curve.append((round(clock, 1), evaluate(greedy(exp), seed), version))
                        print(f"  seed {seed}: {clock:6.1f}s  eval {curve[-1][1]:5.1f}  v{version}", flush=True)
                finally:
                    for p in procs.values():
                        p.send_signal(signal.SIGCONT)
                    paused += time.monotonic() - stop
        for p in procs.values():  # a warm stop: the trainer publishes its last params
            p.send_signal(signal.SIGINT)
        for p in procs.values():
            p.wait(timeout=60)
        version = sync_params(exp, db, version)
        final = evaluate(greedy(exp), seed)
        db.close()
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        shutil.rmtree(workdir, ignore_errors=True)
    solved = [t for t, mean, _ in curve if mean >= SOLVED]
    late = sum(mean >= SOLVED for t, mean, _ in curve if t >= seconds - 60), sum(t >= seconds - 60 for t, *_ in curve)
    first = solved[0] if solved else "-"
    print(f"seed {seed}: final eval {final:.1f} (v{version}); first solved at {first} s; "
          f"evals >= {SOLVED:g} in the last 60 s: {late[0]}/{late[1]}", flush=True)  # fmt: skip
    return dict(seed=seed, seconds=seconds, kills=killed, options=options, buffer=buffer, final=final, version=version,
                first_solved=solved[0] if solved else None, curve=curve)  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds, one run each")
    parser.add_argument("--seconds", type=float, default=210.0, help="training clock of each run")
    parser.add_argument("--kills", type=int, default=0, help="random kill -9 of workers during each run")
    parser.add_argument("--kill", default="", choices=["", "player", "trainer"], help="kill only these workers")
    parser.add_argument("--eval-every-s", type=float, default=15.0, help="training seconds between evals")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="options of the example")
    parser.add_argument("--buffer-size", type=int, default=0, help="sessions the database keeps (0: the example's)")
    parser.add_argument("--out", help="append each run's row here (JSON lines)")
    parser.add_argument("--label", default="", help="a name for this configuration, kept in the rows")
    args = parser.parse_args()
    rows, commit = [], atari_learn.commit()  # the code the runs start from
    for seed in (int(s) for s in args.seeds.split(",")):
        rows.append(run(seed, args.seconds, args.kills, args.eval_every_s, args.set, args.buffer_size, args.kill))
        rows[-1] |= {"label": args.label, "commit": commit}
        if args.out:
            with open(args.out, "a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
    finals = [r["final"] for r in rows]
    passed = sum(f >= SOLVED for f in finals)
    print(f"final evals {', '.join(f'{f:.0f}' for f in finals)}: {passed}/{len(rows)} >= {SOLVED:g}; "
          f"mean {np.mean(finals):.0f}; options {args.set or 'defaults'}, kills {args.kills}, "
          f"buffer {args.buffer_size or 'default'}")  # fmt: skip


if __name__ == "__main__":
    main()
