"""Memory matters: CartPole with its velocities masked, a GRU agent against a 1-frame feedforward one.

    python bench/recurrent.py                                   # gru, then ff: 10 minutes each at most
    python bench/recurrent.py --nets gru --minutes 3 --set max_reuse=4
    python bench/recurrent.py --report bench/results/recurrent-cartpole-2cores.jsonl --plot curves.png
    python bench/recurrent.py --nets random --set env_id=VizdoomDefendCenter-v1   # the floor: random actions
    python bench/recurrent.py --nets gru --minutes 60 --full --set env_id=VizdoomHealthGathering-v1 --keep dbs

Each run is ``python -m tinyverse examples/recurrent.py run --set net=NET`` (1 player, 1 trainer) on a
fresh SQLite file; the clock starts when this script spawns it, so imports and start-up count. Every
``--eval-every`` seconds this process loads the newest params and plays ``--eval-episodes`` greedy
episodes with ``tinyverse.evaluation.evaluate`` (what ``recurrent.py eval`` does): the bar is an eval
mean of ``--bar`` (475) or more. A run ends at the bar (``--full``: goes on) or after ``--minutes``,
with SIGINT (a warm stop). Runs are sequential: two must not share this machine's cores. The evals run on the same
cores as the run (about 1-3% of its time on CartPole).

Rows (JSON lines, ``--out``): every training episode as ``{"kind": "episode", "net", "minutes",
"return", "steps"}``, every eval as ``{"kind": "eval", "net", "minutes", "mean", "std", "version",
"steps"}``, and one summary per run: minutes and env steps to the bar, the best and last eval means,
and the trainer's mean lag metrics (``policy_lag``, ``rho_mean``, ``rho_dev_first`` against
``rho_dev_rest``: how far the first tick of a session, replayed from the stored state, is off the
players' policy compared with the later ticks). ``--keep DIR`` copies each run's database there when it
ends (``DIR/NET-LABEL.db``): ``python -m tinyverse examples/recurrent.py eval --db sqlite:///DIR/gru.db
--record videos`` then films what the run learned.
"""

import argparse
import contextlib
import io
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import atari_learn  # noqa: E402

ROOT = atari_learn.ROOT  # on sys.path: atari_learn put it there
EXP = ROOT / "examples" / "recurrent.py"
WINDOW = 20  # training episodes in the curve's running mean (at least: 1% of a run's episodes)


def run(net: str, minutes: float, options: list[str], workdir: Path, args) -> list[dict]:
    """One ``recurrent.py run`` with periodic greedy evals; returns its rows, summary last."""
    from tinyverse.database import connect
    from tinyverse.evaluation import evaluate
    from tinyverse.loader import load_experiment
    from tinyverse.params import sync_params

    url, prefix = f"sqlite:///{workdir / 'memory.db'}", "recurrent"
    sets = [x for o in [f"net={net}", *options] for x in ("--set", o)]
    argv = [sys.executable, "-m", "tinyverse", str(EXP), "run", "--db", url, "--eval-episodes", "0", "-q", *sets]
    start, code = time.time(), atari_learn.commit()  # the code that runs: the tree may change while it does
    proc = subprocess.Popen(argv, cwd=workdir)
    db = exp = None
    evals, episodes, next_eval, shown, lag = [], [], start + args.eval_every, 0.0, {}
    try:
        while proc.poll() is None and time.time() - start < minutes * 60:
            time.sleep(1)
            if db is None:
                if not (workdir / "memory.db").exists():
                    continue
                db = connect(url, prefix, retry_for=30)
            if exp is None:
                if db.setting("options") is None:
                    continue
                exp = load_experiment(str(EXP), db)  # adopts the run's stored options
            if time.time() < next_eval:
                continue
            next_eval = time.time() + args.eval_every
            if sync_params(exp, db, None) is None:
                continue
            with contextlib.redirect_stdout(io.StringIO()):
                returns = evaluate(exp, db, args.eval_episodes)
            now, steps = (time.time() - start) / 60, db.count_sessions()[1] * exp.run.settings.session_length
            version = db.params_version()
            mean, std = float(np.mean(returns)), float(np.std(returns))
            evals.append({"kind": "eval", "net": net, "label": args.label, "minutes": round(now, 3), "mean": mean,
                          "std": std, "version": version, "steps": steps})  # fmt: skip
            if time.time() - shown >= 60 or evals[-1]["mean"] >= args.bar:
                print(f"  {net} {now:5.1f} min, {steps:,} steps: eval mean {evals[-1]['mean']:.1f}", flush=True)
                shown = time.time()
            if evals[-1]["mean"] >= args.bar and not args.full:
                break
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
        if db is not None:
            for m in db.metrics("episodes", 10**7):
                minutes = round((m["time"] - start) / 60, 3)
                episodes.append({"kind": "episode", "net": net, "label": args.label, "minutes": minutes})
                episodes[-1]["return"] = m["return"]
                episodes[-1]["steps"] = m["steps"]
            episodes.sort(key=lambda r: r["minutes"])
            train = db.metrics("train", 10**6)
            for k in ("policy_lag", "rho_mean", "rho_clipped", "rho_dev_first", "rho_dev_rest"):
                if values := [m[k] for m in train if k in m]:
                    lag[k] = round(float(np.mean(values)), 4)
            db.close()
        if args.keep and (workdir / "memory.db").exists():  # after the warm stop: for an eval video
            Path(args.keep).mkdir(parents=True, exist_ok=True)
            name = Path(args.keep) / f"{'-'.join(x for x in (net, args.label) if x)}.db"
            with contextlib.closing(sqlite3.connect(workdir / "memory.db")) as src:
                with contextlib.closing(sqlite3.connect(name)) as dst:
                    src.backup(dst)
            print(f"  kept {name}", flush=True)
    steps = episodes[-1]["steps"] if episodes else 0
    return [*episodes, *evals, summarize(net, minutes, options, code, episodes, evals, steps, args, **lag)]


def summarize(net, minutes, options, code, episodes, evals, steps, args, **extra) -> dict:
    """A run's summary row: minutes and env steps to the bar, the best and last eval means, ``extra``."""
    hit = next((e for e in evals if e["mean"] >= args.bar), None)
    return {
        "kind": "summary",
        "net": net,
        "label": args.label,
        "full": args.full,
        "date": date.today().isoformat(),
        "commit": code,
        "cores": os.cpu_count(),
        "budget_minutes": minutes,
        "options": options,
        "bar": args.bar,
        "eval_episodes": args.eval_episodes,
        "minutes_to_bar": hit and hit["minutes"],
        "steps_to_bar": hit and hit["steps"],
        "best_eval": max((e["mean"] for e in evals), default=None),
        "last_eval": evals[-1]["mean"] if evals else None,
        "episodes": len(episodes),
        "steps": steps,
        **extra,
    }


def random_policy(options: list[str], args) -> list[dict]:
    """``--random-episodes`` episodes of uniformly random actions on the run's environment (its wrappers and
    action subset included): the floor a learner must rise above. Rows as ``run``'s: one eval of all of them."""
    from tinyverse.loader import load_experiment

    exp = load_experiment(str(EXP), None, dict(o.split("=", 1) for o in options))
    env, start = exp.make_env(), time.time()
    env.action_space.seed(0)
    episodes = []
    for i in range(args.random_episodes):
        env.reset(seed=i)
        ret, steps, done = 0.0, 0, False
        while not done:
            _, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            ret, steps, done = ret + float(reward), steps + 1, terminated or truncated
        minutes = round((time.time() - start) / 60, 3)
        episodes.append({"kind": "episode", "net": "random", "label": args.label, "minutes": minutes,
                         "return": ret, "steps": steps})  # fmt: skip
    env.close()
    returns, steps = [r["return"] for r in episodes], sum(r["steps"] for r in episodes)
    mean, std = float(np.mean(returns)), float(np.std(returns))
    print(f"  random: {len(returns)} episodes, mean {mean:.1f} +- {std:.1f}", flush=True)
    evals = [{"kind": "eval", "net": "random", "label": args.label, "minutes": episodes[-1]["minutes"], "mean": mean,
              "std": std, "version": None, "steps": steps}]  # fmt: skip
    return [*episodes, *evals, summarize("random", 0, options, atari_learn.commit(), episodes, evals, steps, args)]


def report(rows: list[dict]) -> None:
    print(f"{'run':<14}{'to bar (min)':>13}{'steps to bar':>14}{'best eval':>11}{'last eval':>11}{'steps':>11}  lag")
    for r in (r for r in rows if r["kind"] == "summary"):
        cells = [r["minutes_to_bar"], r["steps_to_bar"], r["best_eval"], r["last_eval"]]
        text = ["-" if x is None else f"{x:,.1f}" if isinstance(x, float) else f"{x:,}" for x in cells]
        lag = ", ".join(f"{k} {r[k]}" for k in ("policy_lag", "rho_mean", "rho_dev_first", "rho_dev_rest") if k in r)
        name = f"{r['net']} {r.get('label', '')}".strip()
        print(f"{name:<14}{text[0]:>13}{text[1]:>14}{text[2]:>11}{text[3]:>11}{r['steps']:>11,}  {lag}")
        if r["options"]:
            print(f"{'':<14}options: {' '.join(r['options'])}")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    runs = dict.fromkeys((r["net"], r.get("label", "")) for r in rows if r["kind"] == "summary")
    for i, run in enumerate(runs):
        colour, name = f"C{i}", " ".join(x for x in run if x)
        if run[0] == "random":  # no training: its mean is a floor across the plot
            summary = next(r for r in rows if r["kind"] == "summary" and (r["net"], r.get("label", "")) == run)
            mean = summary["last_eval"]
            ax.axhline(mean, color=colour, lw=1, ls="--", label=f"{name}: mean {mean:.1f}")
            continue
        eps = [r for r in rows if r["kind"] == "episode" and (r["net"], r.get("label", "")) == run]
        if len(eps) >= WINDOW:
            n = max(WINDOW, len(eps) // 100)
            mean = np.convolve([r["return"] for r in eps], np.ones(n) / n, "valid")
            t = [r["minutes"] for r in eps][n - 1 :]
            ax.plot(t, mean, color=colour, lw=0.8, alpha=0.5, label=f"{name}: training, last {n} episodes")
        evals = [r for r in rows if r["kind"] == "eval" and (r["net"], r.get("label", "")) == run]
        ax.plot([r["minutes"] for r in evals], [r["mean"] for r in evals], "o-", color=colour, ms=3,
                label=f"{name}: greedy eval mean")  # fmt: skip
    bar = next((r["bar"] for r in rows if r["kind"] == "summary"), 475)
    if bar < 2 * max((r["return"] for r in rows if r["kind"] == "episode"), default=bar):  # not --bar 1e9
        ax.axhline(bar, color="grey", lw=0.5, ls=":")
    options = next((r["options"] for r in rows if r["kind"] == "summary"), [])
    env = next((o.split("=", 1)[1] for o in options if o.startswith("env_id=")), "CartPole, position and angle only")
    ax.set(xlabel="wall time (minutes)", ylabel="return", title=f"{env}, {os.cpu_count()} cores")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nets", default="gru,ff", help="comma-separated: gru, ff, random (one after the other)")
    parser.add_argument("--random-episodes", type=int, default=50, help="episodes of the random policy")
    parser.add_argument("--minutes", type=float, default=10.0, help="wall-time budget of each run")
    parser.add_argument("--bar", type=float, default=475.0, help="the eval mean that ends a run")
    parser.add_argument("--full", action="store_true", help="run the whole budget, past the bar")
    parser.add_argument("--label", default="", help="a name for this configuration in the table and the plot")
    parser.add_argument("--eval-every", type=float, default=20.0, help="seconds between evals")
    parser.add_argument("--eval-episodes", type=int, default=10, help="greedy episodes per eval")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="options of recurrent.py")
    parser.add_argument("--out", default=f"recurrent-{date.today().isoformat()}.jsonl", help="rows (JSON lines)")
    parser.add_argument("--keep", metavar="DIR", help="copy each run's database into DIR (NET-LABEL.db) at its end")
    parser.add_argument("--report", help="print the table of a rows file instead of running")
    parser.add_argument("--plot", help="draw the curves of --report's file (or of this run) into a PNG")
    args = parser.parse_args()
    if not args.report:
        for net in args.nets.split(","):
            if net == "random":
                rows = random_policy(args.set, args)
            else:
                print(f"{net}: up to {args.minutes:g} minutes", flush=True)
                with tempfile.TemporaryDirectory() as tmp:
                    rows = run(net, args.minutes, args.set, Path(tmp), args)
            with open(args.out, "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            report(rows)
    rows = [json.loads(line) for line in Path(args.report or args.out).read_text().splitlines() if line.strip()]
    report(rows)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
