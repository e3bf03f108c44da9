"""Scaling: more players, more trainers (a parameter server), and what each doubling buys.

    python bench/scaling.py                                      # LunarLander-v3 DQN: players 1,2 x trainers 1,2
    python bench/scaling.py --players 1,2,4,8 --trainers 1,2,4 --seeds 0,1,2 --json rows.jsonl
    python bench/scaling.py --env CartPole-v1 --players 1 --trainers 1,2,4,8 --budget-s 60 --no-stop
    python bench/scaling.py --players 1,2,4,8 --trainers 1,2,4 --budget-s 15 --throughput  # rates only
    python bench/scaling.py --env pong --players 1,2 --minutes 45  # the pixel agent, to -15
    python bench/scaling.py --report bench/results/scaling-2cores.jsonl

Each configuration is one run of real processes on a fresh SQLite file (``bench/dqn.py``'s runner
for the DQN presets, judged by 10-episode greedy evals off the clock; ``bench/atari_learn.py``'s for
Pong, judged by the mean of the last 50 training episodes). Printed per run: wall time and env
steps to the target (LunarLander-v3 200, CartPole-v1 475, Acrobot-v1 -100, Pong -15), env steps/s
and updates/s over the run (all players, all trainers), and the trainers' publishing: the share
of their time spent pushing (``push_s`` / (trainers x wall time)) and the races lost per push.
Efficiency per doubling compares a run with the one of half the players (or trainers), the rest
alike: throughput ``rate(2n) / (2 x rate(n))`` and time to target ``t(n) / (2 x t(2n))``; 1.0 is
perfect, 0.5 means the doubling bought nothing.

Runs are sequential, and every process shares this machine's cores: on 2 cores, 4 processes
already compete for them, so read the ratios, and run the large counts on a large machine.
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import atari_learn  # noqa: E402
import dqn  # noqa: E402


def run_pong(players: int, trainers: int, minutes: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        episodes, lag = atari_learn.run_tinyverse(minutes, players, [], Path(tmp), trainers=trainers)
    to = atari_learn.reached(episodes)["-15"]
    steps = episodes[-1][2] if episodes else 0
    wall = episodes[-1][0] * 60 if episodes else minutes * 60
    to_steps = atari_learn.reached(episodes, 2)["-15"]
    return {"solved_s": None if to is None else to * 60, "solved_steps": to_steps, "steps": steps, "wall_s": wall,
            "final": atari_learn.last_mean(episodes), **lag}  # fmt: skip


def run(env: str, seed: int, players: int, trainers: int, args) -> dict:
    if env == "pong":
        row = run_pong(players, trainers, args.minutes)
    else:
        extra = [tuple(o.split("=", 1)) for o in args.set]
        stop, every = (False, 10**12) if args.throughput else (not args.no_stop, None)
        row = dqn.run_tinyverse(env, seed, args.budget_s, players, "all", stop, None, extra, trainers, eval_every=every)
        row.pop("evals", None)
    return {**row, "env": env, "seed": seed, "players": players, "trainers": trainers, "commit": args.commit}


def rates(r: dict) -> tuple[float, float]:
    wall = max(r["wall_s"], 1e-9)
    return r["steps"] / wall, r.get("updates", 0) / wall


def show(rows: list[dict]) -> None:
    head = f"{'env':<16}{'seed':>5}{'players':>8}{'trainers':>9}{'to target':>11}{'steps':>9}"
    print(head + f"{'steps/s':>9}{'updates/s':>10}{'push':>7}{'lost/push':>10}{'final':>8}")
    for r in rows:
        steps_s, updates_s = rates(r)
        to = "-" if r.get("solved_s") is None else f"{r['solved_s']:.0f} s"
        push = f"{100 * r['push_s'] / (r['trainers'] * r['wall_s']):.1f}%" if r.get("pushes") else "-"
        lost = f"{r['push_conflicts'] / r['pushes']:.2f}" if r.get("pushes") else "-"
        final = "-" if r.get("final") is None else f"{r['final']:.0f}"
        print(f"{r['env']:<16}{r['seed']:>5}{r['players']:>8}{r['trainers']:>9}{to:>11}{r['steps']:>9,}"
              f"{steps_s:>9,.0f}{updates_s:>10,.1f}{push:>7}{lost:>10}{final:>8}")  # fmt: skip
    by = {(r["env"], r["seed"], r["players"], r["trainers"]): r for r in rows}
    lines = []
    for (env, seed, p, t), r in by.items():
        for what, n, half in (("players", p, (env, seed, p // 2, t)), ("trainers", t, (env, seed, p, t // 2))):
            if n % 2 or (base := by.get(half)) is None:
                continue
            (s2, u2), (s1, u1) = rates(r), rates(base)
            t1, t2 = base.get("solved_s"), r.get("solved_s")
            steps = f"{s2 / (2 * s1):.2f}" if s1 else "-"
            updates = f"{u2 / (2 * u1):.2f}" if u1 else "-"
            to = f"{t1 / (2 * t2):.2f}" if t1 and t2 else "-"
            lines.append(f"  {env} seed {seed}, {what} {n // 2} -> {n}: steps/s {steps}, "
                         f"updates/s {updates}, time to target {to}")  # fmt: skip
    if lines:
        print("efficiency per doubling (1.0 perfect, 0.5 nothing gained):")
        print("\n".join(lines))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--env", default="LunarLander-v3", help="a DQN preset's env id (bench/dqn.py), or pong")
    p.add_argument("--players", default="1,2", help="player counts, comma-separated")
    p.add_argument("--trainers", default="1,2", help="trainer counts, comma-separated")
    p.add_argument("--seeds", default="0", help="seeds, comma-separated (DQN)")
    p.add_argument("--budget-s", type=float, default=900.0, help="training time of each DQN run, seconds")
    p.add_argument("--minutes", type=float, default=45.0, help="wall time of each Pong run, minutes")
    p.add_argument("--no-stop", action="store_true", help="run the whole budget even once solved (DQN)")
    p.add_argument("--throughput", action="store_true", help="rates only: the whole budget, one eval at the end (DQN)")
    p.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="options of the example")
    p.add_argument("--json", help="append each row to this JSON-lines file")
    p.add_argument("--report", help="print the tables of a JSON-lines file instead of running")
    args = p.parse_args()
    if args.report:
        return show([json.loads(line) for line in Path(args.report).read_text().splitlines() if line.strip()])
    rows, args.commit = [], atari_learn.commit()
    for seed in map(int, args.seeds.split(",")):
        for trainers in map(int, args.trainers.split(",")):
            for players in map(int, args.players.split(",")):
                print(f"# {args.env} seed {seed}: {players} players, {trainers} trainers", flush=True)
                rows.append(run(args.env, seed, players, trainers, args))
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(rows[-1]) + "\n")
                show(rows[-1:])
    show(rows)


if __name__ == "__main__":
    main()
