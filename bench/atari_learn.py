"""Pong from pixels: wall time to a mean return of -15, -5 and 0, tinyverse vs Stable-Baselines3 PPO.

    python bench/atari_learn.py                                   # both, one after the other (~90 min)
    python bench/atari_learn.py --systems tinyverse --minutes 45  # one system
    python bench/atari_learn.py --systems tinyverse --players 2 --set max_reuse=1
    python bench/atari_learn.py --systems tinyverse --sync-every 20 --set vtrace=false --set clip=0  # lag, plain A2C
    python bench/atari_learn.py --report lag.jsonl --plot lag.png --by-steps   # curves against agent steps
    python bench/atari_learn.py --report bench/results/atari-learn-2cores.jsonl --plot pong.png
    python bench/atari_learn.py --profile                         # where a trainer update's time goes
    python bench/atari_learn.py --systems tinyverse --minutes 120 --set env_id=CarRacing-v3 --thresholds 0,300,600
    python bench/atari_learn.py --systems random,tinyverse --set env_id=ALE/Breakout-v5 --thresholds 5,10,20

Both systems play Pong with the settings of ``PongNoFrameskip-v4`` (no sticky actions, 4 frames an
agent step, up to 30 NOOPs at reset) and are judged alike: the mean return of the last 50 finished
training episodes (all environments together, raw scores), at each episode's end; a threshold is
reached at the first episode where that mean is at or above it. The clock starts when this script
spawns the system's process, so imports and start-up count. A run ends at the last threshold (Pong: 0)
or after ``--minutes``. Another game (``--set env_id=...``) takes its own ``--thresholds``.

- tinyverse: ``python -m tinyverse examples/atari.py run`` with its defaults (``--players``, ``--set``
  options) on a fresh SQLite file; this process reads the episodes from the database every 10 s and
  stops the run with SIGINT (a warm stop) at the end.
- SB3: PPO with RL-Zoo's Atari hyperparameters (8 envs, 128 steps, 4 epochs, batch 256, lr 2.5e-4 and
  clip 0.1 both decayed linearly over 10M steps, ent 0.01, vf 0.5) on ``PongNoFrameskip-v4`` with
  SB3's Atari wrappers and 4 stacked frames, seed 0 (``--sb3-seed``), in a subprocess with torch's default
  threads. Its seed fixes the agent steps at which it reaches each level; the wall time varies with the machine.

- random: uniformly random actions in the same game (atari.py's environment and options) for
  ``--random-episodes`` episodes in this process: the floor a learner has to clear.

Rows go to ``--out`` (JSON lines): every episode as ``{"system", "minutes", "return"}`` (tinyverse's also
with ``steps``, agent steps played by then) and one summary per run; tinyverse's summary adds the
trainer's mean ``policy_lag`` (params versions between acting and training), ``rho_mean`` and
``rho_clipped`` (importance weights), ``clip_fraction`` (ticks whose ratio to the players' policy lies
outside PPO's clip), ``reuse`` (sessions trained on per session played: the pace's
``max_reuse``) and ``player_share`` (each player's share of the episodes). Runs are sequential: the
two systems must not share this machine's cores.

The lag benchmark: ``--sync-every 20`` starts a trainer and players that look for new params only
every 20 rounds (also while they wait for the trainer), so they act with params many updates old;
``--set vtrace=false --set clip=0`` trains with plain A2C, which has no correction for that lag.
"""

import argparse
import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
THRESHOLDS = (-15.0, -5.0, 0.0)
WINDOW = 50


def commit() -> str:
    """The checkout's commit, with + if tracked files have changes (the rows of any bench script keep it)."""

    def git(*a):
        return subprocess.run(["git", "-C", str(ROOT), *a], capture_output=True, text=True).stdout.strip()

    return (git("rev-parse", "--short", "HEAD") or "unknown") + ("+" if git("status", "--porcelain", "-uno") else "")


def reached(episodes: list[tuple], x: int = 0) -> dict[str, float | None]:
    """Minutes (``x`` 0; steps: 2) at which the last-WINDOW mean first reaches each threshold (None: never)."""
    returns, out = np.array([e[1] for e in episodes]), {}
    means = np.convolve(returns, np.ones(WINDOW) / WINDOW, "valid") if len(returns) >= WINDOW else np.array([])
    for threshold in THRESHOLDS:
        hit = np.nonzero(means >= threshold)[0]
        out[f"{threshold:g}"] = round(episodes[hit[0] + WINDOW - 1][x], 2) if len(hit) else None
    return out


def last_mean(episodes: list[tuple]) -> float | None:
    return float(np.mean([e[1] for e in episodes[-WINDOW:]])) if episodes else None


def progress(system: str, start: float, episodes: list[tuple], shown: float) -> float:
    """Print the run's progress if a minute has passed since ``shown``; returns when it last printed."""
    if time.time() - shown < 60:
        return shown
    mean = last_mean(episodes)
    minutes, text = (time.time() - start) / 60, "-" if mean is None else f"{mean:.1f}"
    print(f"  {system} {minutes:5.1f} min: {len(episodes)} episodes, last-{WINDOW} mean {text}", flush=True)
    return time.time()


def run_tinyverse(
    minutes: float,
    players: int,
    options: list[str],
    workdir: Path,
    sync_every: int = 1,
    trainers: int = 1,
    experiment: Path = ROOT / "examples" / "atari.py",
    stop_at: float = THRESHOLDS[-1],
    keep: str | None = None,
    play_batch: int | None = None,
) -> tuple[list[tuple[float, float, int]], dict]:
    """``atari.py run``, or with ``sync_every`` > 1 a trainer and players started one by one (``play -s``).

    Returns the episodes (minutes, return, agent steps) and the trainer's mean lag metrics."""
    from tinyverse.database import connect

    url = f"sqlite:///{workdir / 'run.db'}"
    sets = [x for o in options for x in ("--set", o)]
    batch = ["-b", str(play_batch)] if play_batch else []  # environments per player (default: atari.py's 8)
    base = [sys.executable, "-m", "tinyverse", str(experiment)]
    if sync_every == 1:
        fleet = ["--players", str(players), "--trainers", str(trainers), *batch]
        argvs = [[*base, "run", "--db", url, *fleet, "--eval-episodes", "0", "-q", *sets]]
    else:  # the trainers first, so that they store the options the players adopt
        argvs = [[*base, "train", "--db", url, "-q", *sets] for _ in range(trainers)]
        argvs += [[*base, "play", "--db", url, "-s", str(sync_every), "-q", *batch, *sets] for _ in range(players)]
    start = time.time()
    procs = []
    for argv in argvs:
        procs.append(subprocess.Popen(argv, cwd=workdir))
        time.sleep(3 if len(argvs) > 1 else 0)
    db, episodes, shown, lag = None, [], 0.0, {}
    try:
        while all(p.poll() is None for p in procs) and time.time() - start < minutes * 60:
            time.sleep(10)
            db = db or (connect(url, experiment.stem) if (workdir / "run.db").exists() else None)
            if db is None:
                continue
            found = [((m["time"] - start) / 60, m["return"], m["steps"]) for m in db.metrics("episodes", 10**6)]
            episodes = sorted(found)
            shown = progress("tinyverse", start, episodes, shown)
            returns = [e[1] for e in episodes]
            if len(returns) >= WINDOW and np.convolve(returns, np.ones(WINDOW) / WINDOW, "valid").max() >= stop_at:
                break
    except KeyboardInterrupt:  # Ctrl-C, or kill (SIGTERM; a background job ignores SIGINT): keep the rows
        print("interrupted: stopping the run; its episodes so far are recorded", flush=True)
    finally:
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGINT)  # a warm stop: workers finish their step, the trainer publishes
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
        if db is not None:
            lag = feeding(db)
            db.close()
        if keep:
            for suffix in ("", "-wal"):  # the workers have stopped: what a killed one left in its log too
                if (workdir / f"run.db{suffix}").exists():
                    shutil.copyfile(workdir / f"run.db{suffix}", f"{keep}{suffix}")
            print(f"kept the run's database in {keep}")
    return episodes, lag


LAG = ("policy_lag", "rho_mean", "rho_clipped", "clip_fraction")
FED = (*LAG, "reuse", "updates_per_s", "steps_per_s", "player_share")


def feeding(db) -> dict:
    """How the trainer was fed: its mean lag metrics; ``reuse``, the sessions it trained on per session played
    (the pace's target: ``max_reuse``); ``updates_per_s`` and ``steps_per_s``, the trainer's and the players'
    rates after the first 30 s (start-up left out); ``player_share``, each player's share of the episodes played."""
    train, out = db.metrics("train", 10**6), {}
    for k in LAG:
        if values := [m[k] for m in train if k in m]:
            out[k] = round(float(np.mean(values)), 3)
    if train and (added := db.count_sessions().added):
        out["reuse"] = round(db.counter("updates") * train[-1]["batch"] / added, 3)
    if len(late := [m for m in train if m["time"] >= train[0]["time"] + 30]) > 1:
        first, last = late[0], late[-1]
        rate = {k: (last[k] - first[k]) / (last["time"] - first["time"]) for k in ("updates", "steps")}
        out |= {"updates_per_s": round(rate["updates"], 2), "steps_per_s": round(rate["steps"])}
    players = collections.Counter(m["worker"] for m in db.metrics("episodes", 10**6))
    out["player_share"] = sorted((round(n / players.total(), 3) for n in players.values()), reverse=True)
    return out


def run_random(options: list[str], n: int) -> list[tuple]:
    """``n`` episodes of uniformly random actions in atari.py's game, with its options (``--set``)."""
    from tinyverse.loader import load_experiment, parse_set

    exp = load_experiment(str(ROOT / "examples" / "atari.py"), options=dict(parse_set(o) for o in options))
    env, start, episodes = exp.make_env(), time.time(), []
    for i in range(n):
        env.reset(seed=i)
        env.action_space.seed(i)
        total, done = 0.0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            total, done = total + float(reward), terminated or truncated
        episodes.append(((time.time() - start) / 60, total, None))
        print(f"  random      episode {i + 1} of {n}: {total:g}", flush=True)
    env.close()
    return episodes


def run_sb3(minutes: float, seed: int) -> list[tuple]:
    argv = [sys.executable, __file__, "--sb3-worker", "--minutes", str(minutes), "--sb3-seed", str(seed)]
    start, episodes, shown = time.time(), [], 0.0
    with subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) as proc:
        for line in proc.stdout:
            row = json.loads(line)
            episodes.append(((row["time"] - start) / 60, row["return"], row["steps"]))
            shown = progress("sb3", start, episodes, shown)
    if proc.returncode:
        raise SystemExit(f"the SB3 run failed (exit {proc.returncode}): see its error above; nothing was recorded")
    return episodes


def sb3_worker(minutes: float, seed: int) -> None:
    """PPO on Pong with RL-Zoo's settings; prints every finished episode as a JSON line."""
    import ale_py
    import gymnasium as gym
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    deadline, returns = time.time() + minutes * 60, []

    class Episodes(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    returns.append(info["episode"]["r"])
                    row = {"time": time.time(), "return": float(info["episode"]["r"]), "steps": self.num_timesteps}
                    print(json.dumps(row), flush=True)
            solved = len(returns) >= WINDOW and np.mean(returns[-WINDOW:]) >= THRESHOLDS[-1]
            return time.time() < deadline and not solved

    env = VecFrameStack(make_atari_env("PongNoFrameskip-v4", n_envs=8, seed=seed), n_stack=4)
    decay = lambda start: lambda progress: start * progress  # noqa: E731  (RL-Zoo's lin_ schedules)
    model = PPO(
        "CnnPolicy", env, n_steps=128, n_epochs=4, batch_size=256, learning_rate=decay(2.5e-4),
        clip_range=decay(0.1), vf_coef=0.5, ent_coef=0.01, seed=seed, verbose=0,
    )  # fmt: skip
    model.learn(10_000_000, callback=Episodes())


def profile(batch_size: int, updates: int) -> None:
    """Where a trainer update's time goes, for each torso: sampling, window rebuild, the whole step."""
    sys.path.insert(0, str(ROOT / "examples"))
    import atari
    import torch

    from tinyverse.database import connect
    from tinyverse.player import play

    with tempfile.TemporaryDirectory() as tmp:
        db = connect(f"sqlite:///{tmp}/p.db", "p")
        play(atari.make_experiment(atari.Args()), db, batch_size=8, rounds=max(2, batch_size // 4))
        print(f"one update on {batch_size} sessions of 25 ticks, {torch.get_num_threads()} torch thread(s), "
              f"mean of {updates}:")  # fmt: skip
        for net in atari.ActorCritic.TORSOS:
            exp = atari.make_experiment(atari.Args(net=net))
            exp.prepare_training()
            exp.train_step(exp.sample(db, batch_size))  # warm-up
            spent = {"sample": 0.0, "windows": 0.0, "train_step": 0.0}
            for _ in range(updates):
                t0 = time.perf_counter()
                batch = exp.sample(db, batch_size)
                t1 = time.perf_counter()
                exp.windows(batch)
                t2 = time.perf_counter()
                exp.train_step(batch)
                t3 = time.perf_counter()
                for k, dt in zip(spent, (t1 - t0, t2 - t1, t3 - t2), strict=True):
                    spent[k] += dt / updates
            total = spent["sample"] + spent["train_step"]
            shown = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in spent.items())
            print(f"  {net:<7} {shown} (windows are part of train_step): "
                  f"{1 / total:.1f} updates/s, {batch_size * 25 / total:,.0f} ticks trained/s")  # fmt: skip
        db.close()


def summary(system: str, episodes: list[tuple], minutes: float, extra: dict) -> dict:
    return {
        "kind": "summary",
        "system": system,
        "date": date.today().isoformat(),
        "commit": commit(),
        "cores": os.cpu_count(),
        "budget_minutes": minutes,
        "episodes": len(episodes),
        "minutes_to": reached(episodes),
        **({"steps_to": reached(episodes, 2), "steps": episodes[-1][2]} if episodes and episodes[-1][2] else {}),
        "final_mean": last_mean(episodes),
        **extra,
    }


def report(rows: list[dict]) -> None:
    runs = [r for r in rows if r.get("kind") == "summary"]
    for r in runs:  # thresholds the run did not time (other --thresholds), from its episode rows
        if any(f"{t:g}" not in r["minutes_to"] for t in THRESHOLDS):
            key = (r["system"], r.get("label", ""), r.get("commit"))
            eps = [(e["minutes"], e["return"], e.get("steps")) for e in rows if e.get("kind") == "episode"
                   and (e["system"], e.get("label", ""), r.get("commit")) == key]  # fmt: skip
            r["minutes_to"] = {**reached(eps), **r["minutes_to"]}
            if "steps_to" in r:
                r["steps_to"] = {**reached(eps, 2), **r["steps_to"]}
    head = "".join(f"{'to ' + f'{t:g}':>9}" for t in THRESHOLDS)
    print(f"{'system':<34}{head}{'last mean':>11}{'episodes':>10}   (minutes of wall time)")
    for r in runs:
        label = r["system"] + (f" {r['label']}" if r.get("label") else "")
        cells = "".join(
            f"{'-' if r['minutes_to'][f'{t:g}'] is None else r['minutes_to'][f'{t:g}']:>9}" for t in THRESHOLDS
        )
        final = "-" if r["final_mean"] is None else f"{r['final_mean']:.1f}"
        print(f"{label:<34}{cells}{final:>11}{r['episodes']:>10}")
        if "steps_to" in r:
            steps = ", ".join(f"{t:g}: {r['steps_to'][f'{t:g}'] or '-'}" for t in THRESHOLDS)
            how = [f"{k.replace('_', ' ')} {r[k]}" for k in ("sync_every", "seed") if k in r]  # tinyverse's, SB3's
            how.append(", ".join(f"{k} {r[k]}" for k in FED if k in r))  # tinyverse's: how the trainer was fed
            print(f"{'':<4}agent steps to {steps} (of {r['steps']:,}); {'; '.join(filter(None, how))}")
    sb3 = [(i, b) for i, b in enumerate(runs) if b["system"] == "sb3"]
    for i, r in enumerate(runs):  # against the SB3 run of the same label (one script run), else the nearest
        same = [b for _, b in sb3 if b.get("label") == r.get("label")]  # before it, else the first after it
        base = (same or [b for j, b in sb3 if j < i][-1:] or [b for _, b in sb3] or [None])[0]
        if r["system"] == "tinyverse" and base:
            ratios = []
            for t in THRESHOLDS:
                ours, theirs = r["minutes_to"][f"{t:g}"], base["minutes_to"][f"{t:g}"]
                if ours is not None and theirs is None:  # SB3 did not get there in its whole budget
                    ratios.append(f"<{ours / base['budget_minutes']:.2f}")
                else:
                    ratios.append("-" if ours is None or theirs is None else f"{ours / theirs:.2f}")
            print(
                f"ratio {r.get('label') or r['system']} / sb3 at {', '.join(f'{t:g}' for t in THRESHOLDS)}: "
                f"{', '.join(ratios)}"
            )


def plot(rows: list[dict], path: str, by_steps: bool = False, labels: list[str] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    runs = {(r["system"], r.get("label", "")) for r in rows if r.get("kind") == "episode"}
    for run in sorted(run for run in runs if labels is None or run[1] in labels):
        eps = [(r["steps"] if by_steps else r["minutes"], r["return"]) for r in rows
               if (r.get("kind"), r["system"], r.get("label", "")) == ("episode", *run) and (r.get("steps") or
               not by_steps)]  # fmt: skip
        if run[0] == "random" and eps:  # a few episodes: their mean, as a level
            ax.axhline(np.mean([x for _, x in eps]), color="black", lw=1, ls="--", label=f"random play ({len(eps)})")
        elif len(eps) >= WINDOW:
            t = [m for m, _ in eps][WINDOW - 1 :]
            mean = np.convolve([x for _, x in eps], np.ones(WINDOW) / WINDOW, "valid")
            name = " ".join(x for x in run if x)
            if run[0] == "sb3":  # SB3 rows carry the label of the script run they belong to, or their own
                after = f", the run after {run[1]}" if run[1] else ""
                name = run[1] if run[1].startswith("SB3") else f"SB3 PPO{after}"
            ax.plot(t, mean, label=name)
    for t in THRESHOLDS:
        ax.axhline(t, color="grey", lw=0.5, ls=":")
    xlabel = "agent steps" if by_steps else "wall time (minutes)"
    games = {o.split("=", 1)[1] for r in rows for o in r.get("options", []) if o.startswith("env_id=")}
    title = f"{', '.join(sorted(games)) or 'Pong'}, 2 cores"
    ax.set(xlabel=xlabel, ylabel=f"mean return, last {WINDOW} episodes", title=title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def interrupt(*_) -> None:
    raise KeyboardInterrupt


def main():
    signal.signal(signal.SIGINT, signal.default_int_handler)  # a background job starts with SIGINT ignored
    signal.signal(signal.SIGTERM, interrupt)  # kill PID stops a run as Ctrl-C does: its rows are kept
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--systems", default="tinyverse,sb3", help="comma-separated: tinyverse, sb3, random")
    parser.add_argument("--random-episodes", type=int, default=10, help="episodes of the random system")
    parser.add_argument("--minutes", type=float, default=45.0, help="wall-time budget of each run")
    parser.add_argument("--players", type=int, default=1, help="tinyverse player processes")
    parser.add_argument("--play-batch", type=int, help="tinyverse environments per player (default: atari.py's)")
    parser.add_argument("--sync-every", type=int, default=1, help="players look for new params every N rounds")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="options of atari.py")
    parser.add_argument("--thresholds", default="-15,-5,0", help="mean returns to time; the run ends at the last")
    parser.add_argument("--keep", help="copy tinyverse's database here at the end (e.g. to eval or record it)")
    parser.add_argument("--label", default="", help="a name for this configuration in the tables")
    parser.add_argument("--out", default=f"atari-learn-{date.today().isoformat()}.jsonl", help="rows (JSON lines)")
    parser.add_argument("--report", help="print the tables of a rows file instead of running")
    parser.add_argument("--plot", help="draw the curves of --report's file (or of this run) into a PNG")
    parser.add_argument("--by-steps", action="store_true", help="plot against agent steps, not wall time")
    parser.add_argument("--label-only", action="append", metavar="LABEL", help="plot only this label's runs (repeat)")
    parser.add_argument("--profile", action="store_true", help="time the trainer's update per torso instead")
    parser.add_argument("--sb3-seed", type=int, default=0, help="the seed of SB3's run (default 0)")
    parser.add_argument("--sb3-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    global THRESHOLDS
    THRESHOLDS = tuple(float(t) for t in args.thresholds.split(","))
    if args.sb3_worker:
        return sb3_worker(args.minutes, args.sb3_seed)
    if args.profile:
        return profile(8, 20)
    if args.report:
        rows = [json.loads(line) for line in Path(args.report).read_text().splitlines() if line.strip()]
        report(rows)
        if args.plot:
            plot(rows, args.plot, args.by_steps, args.label_only)
        return
    at = commit()  # the tree that runs, whatever is committed meanwhile
    for system in args.systems.split(","):
        print(f"{system}: up to {args.minutes:g} minutes", flush=True)
        extra = {"label": args.label, "commit": at}
        if system == "tinyverse":
            with tempfile.TemporaryDirectory() as tmp:
                run = (args.minutes, args.players, args.set, Path(tmp), args.sync_every)
                episodes, lag = run_tinyverse(*run, stop_at=THRESHOLDS[-1], keep=args.keep, play_batch=args.play_batch)
            extra |= {"players": args.players, "options": args.set, "sync_every": args.sync_every, **lag}
            extra |= {"play_batch": args.play_batch} if args.play_batch else {}
        elif system == "sb3":
            episodes = run_sb3(args.minutes, args.sb3_seed)
            extra |= {"seed": args.sb3_seed}
        elif system == "random":
            episodes = run_random(args.set, args.random_episodes)
            extra |= {"options": args.set}
        else:
            parser.error(f"unknown system {system!r}: tinyverse, sb3 or random")
        rows = [{"kind": "episode", "system": system, "label": args.label, "minutes": round(m, 3), "return": r,
                 **({"steps": n} if n else {})} for m, r, n in episodes]  # fmt: skip
        rows.append(summary(system, episodes, args.minutes, extra))
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
        report([rows[-1]])
    rows = [json.loads(line) for line in Path(args.out).read_text().splitlines() if line.strip()]
    report(rows)
    if args.plot:
        plot(rows, args.plot, args.by_steps, args.label_only)


if __name__ == "__main__":
    main()
