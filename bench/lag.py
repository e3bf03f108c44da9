"""Lag, measured: players that pick up new params every round or every 20, with V-trace and without.

    python bench/lag.py                                   # masked CartPole, 4 runs of up to 6 minutes
    python bench/lag.py --sync 1,20 --configs appo,a2c --minutes 6 --out lag.jsonl
    python bench/lag.py --experiment examples/atari.py --set env_id=ALE/Pong-v5 --threshold -15 --minutes 45
    python bench/lag.py --report bench/results/lag-cartpole-2cores.jsonl --plot lag.png

The learner is the on-policy actor-critic of the examples (APPO, ``examples/common.py``), by
default in ``examples/recurrent.py``'s GRU agent on CartPole seeing position and angle only (it
learns in minutes on 2 cores; ``examples/atari.py`` for Pong): players record the
log-probability of each action they took, the trainer weighs each tick by the ratio of its policy to
the player's. Each run trains one trainer and one player with ``play --sync-every S``: the player
looks for new params every S rounds only (also while it waits for the trainer), so with S = 20 it
acts with params many updates old. Configurations:

- ``appo``: the example's default, V-trace targets and advantages with PPO's clipped surrogate on
  the ratio to the player's policy;
- ``a2c``: ``--set vtrace=false --set clip=0``, plain advantage actor-critic that takes every
  tick as on-policy: nothing corrects for the lag;
- ``impala1`` and ``a2c1``: IMPALA's loss (V-trace, no clip) and plain A2C with each tick trained on
  once (``max_reuse=1``), as A2C is meant to: without PPO's clip, reusing a tick 8 times (the
  example's default) breaks A2C with no lag at all, so these two isolate what V-trace does.

Judged like ``bench/atari_learn.py``: the mean of the last 50 training episodes, wall time and agent
steps until it first reaches ``--threshold``; each run stops there or after ``--minutes``. The
trainer's mean ``policy_lag`` (params versions between acting and training) and the importance
weights' mean and clipped fraction come from its metrics. Rows (JSON lines) go to ``--out``: the
last-50 mean at up to 400 points of each run (``kind: curve``) and one summary per run.
"""

import argparse
import json
import sys
import tempfile
from datetime import date
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import atari_learn  # noqa: E402
import numpy as np  # noqa: E402

ROOT = atari_learn.ROOT
CONFIGS = {
    "appo": [],
    "a2c": ["vtrace=false", "clip=0"],
    "impala1": ["clip=0", "max_reuse=1"],
    "a2c1": ["vtrace=false", "clip=0", "max_reuse=1"],
}


def run(args, sync: int, config: str) -> list[dict]:
    options = [*args.set, *CONFIGS[config]]
    with tempfile.TemporaryDirectory() as tmp:
        episodes, lag = atari_learn.run_tinyverse(
            args.minutes, 1, options, Path(tmp), sync, 1, Path(args.experiment).resolve(), args.threshold
        )
    label = f"{config}, sync every {sync}"
    rows = curve(episodes, label)
    to = reached(episodes, args.threshold)
    rows.append({"kind": "summary", "label": label, "config": config, "sync_every": sync, "options": options,
                 "experiment": Path(args.experiment).name, "threshold": args.threshold, "minutes": args.minutes,
                 "minutes_to": to[0], "steps_to": to[1], "steps": episodes[-1][2] if episodes else 0,
                 "final_mean": atari_learn.last_mean(episodes), "episodes": len(episodes),
                 "date": date.today().isoformat(), "commit": args.commit, **lag})  # fmt: skip
    return rows


def curve(episodes: list[tuple], label: str, points: int = 400) -> list[dict]:
    """The last-50 mean return at up to ``points`` episodes spread over the run (a failing CartPole agent
    ends tens of thousands of episodes: rows of each would weigh tens of MB)."""
    window, returns = atari_learn.WINDOW, [e[1] for e in episodes]
    picked = (
        sorted({round(i) for i in np.linspace(window - 1, len(episodes) - 1, points)})
        if len(episodes) >= window
        else []
    )
    return [{"kind": "curve", "label": label, "minutes": round(episodes[i][0], 3), "steps": episodes[i][2],
             "mean": float(np.mean(returns[i - window + 1 : i + 1]))} for i in picked]  # fmt: skip


def reached(episodes: list[tuple], threshold: float) -> tuple[float | None, int | None]:
    """(minutes, agent steps) at which the last-50 mean first reaches ``threshold``, or (None, None)."""
    window = atari_learn.WINDOW
    for i in range(window - 1, len(episodes)):
        if sum(e[1] for e in episodes[i - window + 1 : i + 1]) / window >= threshold:
            return round(episodes[i][0], 2), episodes[i][2]
    return None, None


def report(rows: list[dict]) -> None:
    print(f"{'configuration':<26}{'to threshold':>14}{'steps':>10}{'last mean':>11}{'policy lag':>12}"
          f"{'rho mean':>10}{'rho > 1':>9}")  # fmt: skip
    for r in (r for r in rows if r["kind"] == "summary"):
        to = "-" if r["minutes_to"] is None else f"{r['minutes_to']:.1f} min"
        steps = "-" if r["steps_to"] is None else f"{r['steps_to']:,}"
        final = "-" if r["final_mean"] is None else f"{r['final_mean']:.1f}"
        print(f"{r['label']:<26}{to:>14}{steps:>10}{final:>11}{r.get('policy_lag', 0):>12.2f}"
              f"{r.get('rho_mean', 1):>10.3f}{r.get('rho_clipped', 0):>9.2f}")  # fmt: skip
    print(f"(threshold: last-{atari_learn.WINDOW} mean {rows[-1]['threshold']:g}; policy lag in params versions)")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for label in dict.fromkeys(r["label"] for r in rows if r["kind"] == "curve"):
        points = [r for r in rows if r["kind"] == "curve" and r["label"] == label]
        for ax, key in zip(axes, ("minutes", "steps"), strict=True):
            ax.plot([p[key] for p in points], [p["mean"] for p in points], label=label)
    for ax, xlabel in zip(axes, ("wall time (minutes)", "agent steps"), strict=True):
        ax.set(xlabel=xlabel, ylabel=f"mean return, last {atari_learn.WINDOW} episodes")
        ax.legend()
    fig.suptitle("Lag: players syncing params every round or every 20, V-trace on or off (2 cores)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--experiment", default=str(ROOT / "examples" / "recurrent.py"))
    p.add_argument("--set", action="append", default=None, metavar="NAME=VALUE", help="options of the experiment")
    p.add_argument("--sync", default="1,20", help="players' --sync-every values, comma-separated")
    p.add_argument("--configs", default="appo,a2c", help=f"comma-separated: {', '.join(CONFIGS)}")
    p.add_argument("--threshold", type=float, default=475.0, help="last-50 mean return that ends a run")
    p.add_argument("--minutes", type=float, default=6.0, help="wall-time budget of each run")
    p.add_argument("--out", default=f"lag-{date.today().isoformat()}.jsonl", help="rows (JSON lines), appended")
    p.add_argument("--report", help="print the table of a rows file instead of running")
    p.add_argument("--plot", help="draw the curves (of --report's file, or of this run) into a PNG")
    args = p.parse_args()
    args.set = args.set or []
    if args.report:
        rows = [json.loads(line) for line in Path(args.report).read_text().splitlines() if line.strip()]
    else:
        args.commit, rows = atari_learn.commit(), []
        for sync in map(int, args.sync.split(",")):
            for config in args.configs.split(","):
                print(f"# {config}, sync every {sync}: up to {args.minutes:g} minutes", flush=True)
                rows += run(args, sync, config)
                with open(args.out, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows if r["label"] == rows[-1]["label"])
                report([rows[-1]])
    report(rows)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
