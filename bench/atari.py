"""What recording costs an Atari player: agent steps/s of Pong, raw, preprocessed, with the policy, recorded.

    python bench/atari.py                      # ~3 minutes
    python bench/atari.py --seconds 4 --batch 1

Every rate is agent steps per second (one agent step = 4 emulator frames), measured in this one run:

- raw env: ``gym.make("ALE/Pong-v5")`` without sticky actions, RGB frames, random actions;
- env: the experiment's ``make_env()`` (emulator grayscale, ALE's own frame skip, 3 actions, crop,
  80x80), random actions;
- env + policy: the loop a player runs (B envs, ``exp.act`` on the window, resets), nothing stored;
- recorded: ``python -m tinyverse examples/atari.py play -b B`` into a fresh SQLite file,
  counted from the database after a warm-up, while this process publishes new params every 2 s as
  a trainer does (so players also load params).

The env + policy loop and the players run as 1 and then 2 concurrent processes, alternated 3 times;
recording cost is 1 - recorded / (env + policy) per CPU second with the same number of processes
(CPU seconds are steadier than wall seconds on a shared machine; both are printed). Goal: <= 10%.
Also printed: the bytes of an encoded session (frames once) against the same with 4-stacked frames.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "examples"))
EXP = ROOT / "examples" / "atari.py"


def rate_of(step, seconds: float, warmup: float = 1.0) -> tuple[float, float]:
    """Agent steps (what ``step()`` returns) per wall second and per CPU second, after ``warmup`` seconds."""
    end = time.monotonic() + warmup
    while time.monotonic() < end:
        step()
    n, start, cpu = 0, time.monotonic(), time.process_time()
    while time.monotonic() - start < seconds:
        n += step()
    return n / (time.monotonic() - start), n / (time.process_time() - cpu)


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, all threads) a running process has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def env_rate(env, seconds: float) -> float:
    env.reset(seed=0)
    rng = np.random.default_rng(0)

    def step():
        _, _, term, trunc, _ = env.step(int(rng.integers(env.action_space.n)))
        if term or trunc:
            env.reset()
        return 1

    return rate_of(step, seconds)[0]


def loop_rate(batch: int, seconds: float) -> tuple[float, float]:
    """The player's loop without recording: B envs, the policy on the window, resets."""
    import atari

    exp = atari.make_experiment(atari.Args())
    envs = [exp.make_env() for _ in range(batch)]
    obs = np.stack([env.reset(seed=i)[0] for i, env in enumerate(envs)])
    memory = exp.initial_memory(batch)

    def step():
        nonlocal memory
        actions, memory, _ = exp.act(obs, memory)
        for i, env in enumerate(envs):
            o, _, term, trunc, _ = env.step(actions[i])
            if term or trunc:
                o, _ = env.reset()
                for k, v in exp.initial_memory(1).items():
                    memory[k][i] = v[0]
            obs[i] = o
        return batch

    return rate_of(step, seconds, warmup=2.0)


def parallel(argv: list[str], n: int) -> list[subprocess.Popen]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return [subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL) for _ in range(n)]


def loops(n: int, batch: int, seconds: float) -> tuple[float, float]:
    """Env + policy steps of ``n`` concurrent processes: per wall second (total), per CPU second."""
    argv = [sys.executable, __file__, "--loop-worker", "--batch", str(batch), "--seconds", str(seconds)]
    procs = parallel(argv, n)
    rates = [json.loads(p.communicate()[0]) for p in procs]
    return sum(r["wall"] for r in rates), n / sum(1 / r["cpu"] for r in rates)


def players(n: int, batch: int, seconds: float, workdir: Path) -> tuple[float, float]:
    """Steps recorded by ``n`` concurrent players: per wall second (total), per CPU second."""
    from atari import Args

    from tinyverse.database import connect

    path = Path(tempfile.mkdtemp(dir=workdir)) / "players.db"  # a fresh database: counting starts at 0
    db = connect(f"sqlite:///{path}", "atari")
    db.add_to_counter("updates", 10**9)  # a trainer far ahead: the players never wait for one (the pace)
    argv = [sys.executable, "-m", "tinyverse", str(EXP), "play", "-b", str(batch), "--db", f"sqlite:///{path}", "-q"]
    procs = parallel(argv, n)
    stop = threading.Event()
    publisher = threading.Thread(target=publish_params, args=(db, stop), daemon=True)
    try:
        while db.count_sessions()[1] < 4 * n:  # started: imports done, params seeded, envs running
            time.sleep(0.2)
        time.sleep(2.0)
        publisher.start()
        first, start, cpu = db.count_sessions()[1], time.monotonic(), sum(cpu_seconds(p.pid) for p in procs)
        time.sleep(seconds)
        last, wall = db.count_sessions()[1], time.monotonic() - start
        cpu = sum(cpu_seconds(p.pid) for p in procs) - cpu
    finally:
        stop.set()
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(30)
    db.close()
    steps = (last - first) * Args().session_length
    return steps / wall, steps / cpu


def publish_params(db, stop: threading.Event) -> None:
    """Publish changed params every 2 s, as a trainer does, so that players load them."""
    params = db.load_params()[1]
    while not stop.wait(2.0):
        params = {k: v + np.asarray(1e-6, v.dtype) if v.dtype.kind == "f" else v for k, v in params.items()}
        db.save_params(params)


def session_bytes(workdir: Path) -> tuple[int, int]:
    """Encoded bytes of one real 25-tick session: frames once (+ memory) vs every tick's 4-stack."""
    import atari
    from wrappers import window_indices

    from tinyverse.database import connect
    from tinyverse.encoding import encode
    from tinyverse.player import play

    db = connect(f"sqlite:///{workdir / 'one.db'}", "one")
    exp = atari.make_experiment(atari.Args())
    play(exp, db, 1, rounds=2, seed=0)
    s = {k: v[0] for k, v in db.get_batch([2]).items() if k != "id"}
    idx, _ = window_indices(s["terminated"][None], s["truncated"][None], exp.args.window)
    seq = np.concatenate([np.zeros_like(s["observations"][:1]), s["memory.frames"], s["observations"]])
    stacked = {**s, "observations": seq[idx[0]], "final_observations": np.zeros((25, 4, 80, 80), np.uint8)}
    stacked.pop("memory.frames")
    db.close()
    return len(encode(s)), len(encode(stacked))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=6.0, help="measuring time of each rate")
    parser.add_argument("--batch", type=int, help="environments per player (play -b; default: the experiment's)")
    parser.add_argument("--loop-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.loop_worker:
        wall, cpu = loop_rate(args.batch, args.seconds)
        print(json.dumps({"wall": wall, "cpu": cpu}))
        return

    import ale_py
    import atari
    import gymnasium as gym

    gym.register_envs(ale_py)
    s = args.seconds / 2
    batch = args.batch or atari.Args().play_batch_size
    raw = env_rate(gym.make("ALE/Pong-v5", repeat_action_probability=0.0), s)
    env = env_rate(atari.make_experiment(atari.Args()).make_env(), s)
    print(f"Pong-v5, agent steps/s (4 frames each), {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}")
    print(f"  raw env (RGB 210x160)              {raw:8.0f}")
    print(f"  env, make_env() (80x80 gray)       {env:8.0f}   {env / raw:.2f} x raw")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (1, 2):
            # alternated, so that a change in the machine's load hits both sides alike
            runs = [(loops(n, batch, args.seconds), players(n, batch, args.seconds, Path(tmp))) for _ in range(3)]
            (policy, policy_cpu), (recorded, recorded_cpu) = np.mean(runs, axis=0)
            ratios = [r[1] / p[1] for p, r in runs]
            print(
                f"{n} process{'es' if n > 1 else ''}, {batch} env{'s' if batch > 1 else ''} each:"
                " per wall second (all processes), per CPU second (one process)"
            )
            print(f"  env + policy                       {policy:8.0f} {policy_cpu:8.0f}")
            print(f"  recorded into SQLite               {recorded:8.0f} {recorded_cpu:8.0f}")
            print(
                f"  recorded / (env + policy), per CPU second: {', '.join(f'{r:.2f}' for r in ratios)}"
                f" (median {np.median(ratios):.2f}); per wall second {recorded / policy:.2f}"
            )
            print(f"  recording costs {1 - np.median(ratios):.0%} of the CPU (median; goal <= 10%)")
        once, stacked = session_bytes(Path(tmp))
    print(f"an encoded session: {once:,} bytes, frames once; {stacked:,} with 4-stacked frames ({stacked / once:.1f}x)")


if __name__ == "__main__":
    main()
