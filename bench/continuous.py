"""Learning results: examples/ddpg_td3.py, sac.py and naf.py through tinyverse vs Stable-Baselines3 TD3 and SAC.

    python bench/continuous.py --envs Pendulum-v1 --seeds 0 --budget-s 300             # sb3-td3, sb3-sac, td3, sac
    python bench/continuous.py --envs Pendulum-v1 --seeds 0,1,2 --stop-solved --json pendulum.jsonl
    python bench/continuous.py --envs Pendulum-v1 --seeds 0,1,2 --systems tinyverse --stop-solved \\
        --configs ddpg,ddpg/ou,ddpg/param,td3,td3/ou,td3/param,sac,naf,naf/ou,naf/param --json grid.jsonl
    python bench/continuous.py --envs LunarLanderContinuous-v3 --seeds 0,1,2 --budget-s 1800 --json lunar.jsonl
    python bench/continuous.py --report pendulum.jsonl grid.jsonl lunar.jsonl --curve lunar.png
    python bench/continuous.py --envs Pendulum-v1 --seeds 0 --systems tinyverse --set n_step=3   # the examples' options

The protocol is ``bench/dqn.py``'s, through its code (``Tracker``, ``evaluate``, ``result``, ``learn_sb3``
and ``run_tinyverse``): every ``eval_every`` env steps (Pendulum-v1 1,000, LunarLanderContinuous-v3 5,000,
BipedalWalker-v3 10,000) and once at the end, 10 greedy episodes on a separately seeded env, off the clock;
an env is solved at the first eval whose mean reaches the threshold (Pendulum-v1 -200, LunarLanderContinuous-v3
200, BipedalWalker-v3 300). A run ends at RL-Zoo's ``n_timesteps`` of its SB3 counterpart (``--steps``
overrides it), after ``--budget-s`` seconds of training time (wall time less evaluation), or with
``--stop-solved`` at the first eval that solves.

- ``sb3-td3``, ``sb3-sac``: ``stable_baselines3.TD3`` / ``SAC`` in this process with RL-Zoo's
  hyperparameters (``ZOO``: hyperparams/td3.yml and sac.yml), one torch thread; the clock starts when the
  model is built. TD3's ``normal`` noise is SB3's ``NormalActionNoise`` (in [-1, 1] units); SAC's
  LunarLander ``lin_7.3e-4`` is RL-Zoo's linear decay to 0 over its ``n_timesteps`` (with ``--steps``, the
  same decay per env step). SAC's BipedalWalker entry explores with gSDE (``use_sde``, ``log_std_init`` -3),
  as RL-Zoo has it; sac.py's preset samples plain SAC.
- tinyverse: configurations ``algo[/noise]`` (``--configs``; e.g. ``td3``, ``sac``, ``ddpg/ou``,
  ``td3/param``, ``naf``; the noise left out is the example's default: gaussian, none for sac, which
  samples its policy) run as ``python -m tinyverse examples/FILE train`` and ``play`` (one per
  ``--players``) subprocesses on a fresh SQLite file, FILE being ``ddpg_td3.py`` (with ``--set algo``),
  ``sac.py`` or ``naf.py``, with ``--set env_id, seed, noise`` and this script's ``--set``; the
  example fills the rest from its RL-Zoo preset. The clock starts at the spawn.

``--report`` prints the runs, then per configuration the seeds solved, the median time and env steps to
solve (over the seeds that solved) and its ratio to the matching SB3 algorithm's median (``sb3-sac`` for
sac; ``sb3-td3`` for td3, ddpg and naf), the algorithm x exploration table of median time to solve, the
best tinyverse configuration against the faster SB3 (the goal: at most 1.0x with every seed solving),
and, for the larger problem among the rows (LunarLanderContinuous-v3 before Pendulum-v1), the median eval
return of each system at equal training times (a run that ended earlier counts with its last eval).
``--curve PNG`` draws that problem's eval return against training time, one line a run.

On a machine with few cores, evals and all processes share them: compare ratios within one run.
"""

import argparse
import json
import signal
import statistics
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import dqn as dqn_bench  # noqa: E402

from tinyverse.loader import load_experiment  # noqa: E402  (bench/dqn.py put the repo on sys.path)

EXAMPLES = dqn_bench.ROOT / "examples"
FILES = {"ddpg": EXAMPLES / "ddpg_td3.py", "td3": EXAMPLES / "ddpg_td3.py", "sac": EXAMPLES / "sac.py"}
FILES["naf"] = EXAMPLES / "naf.py"
ENVS = ("Pendulum-v1", "LunarLanderContinuous-v3", "BipedalWalker-v3")  # smaller problem first
SOLVED = {"Pendulum-v1": -200.0, "LunarLanderContinuous-v3": 200.0, "BipedalWalker-v3": 300.0}
EVAL_EVERY = {"Pendulum-v1": 1000, "LunarLanderContinuous-v3": 5000, "BipedalWalker-v3": 10_000}
# rl-baselines3-zoo (read at its commit 22e3ff2, April 2026; BipedalWalker-v3: td3.yml at a02f4fb, sac.yml at c94924e):
# hyperparams/td3.yml and sac.yml; SB3's defaults for the rest (batch_size 256, tau 0.005, TD3's policy_delay 2
# and target noise 0.2 / clip 0.5)
_TD3 = dict(  # td3.yml: Pendulum-v1, LunarLanderContinuous-v3 and BipedalWalker-v3 alike
    gamma=0.98,
    buffer_size=200_000,
    learning_starts=10_000,
    noise_std=0.1,  # noise_type normal
    gradient_steps=1,
    train_freq=1,
    learning_rate=1e-3,
    net_arch=[400, 300],
)
ZOO = {
    "td3": {
        "Pendulum-v1": dict(n_timesteps=20_000, **_TD3),
        "LunarLanderContinuous-v3": dict(n_timesteps=300_000, **_TD3),
        "BipedalWalker-v3": dict(n_timesteps=1_000_000, **_TD3),
    },
    "sac": {  # sac.yml
        "Pendulum-v1": dict(n_timesteps=20_000, learning_rate=1e-3),
        "LunarLanderContinuous-v3": dict(
            n_timesteps=500_000,
            batch_size=256,
            learning_rate="lin_7.3e-4",
            buffer_size=1_000_000,
            ent_coef="auto",
            gamma=0.99,
            tau=0.01,
            train_freq=1,
            gradient_steps=1,
            learning_starts=10_000,
            net_arch=[400, 300],
        ),
        "BipedalWalker-v3": dict(
            n_timesteps=500_000,
            batch_size=256,
            learning_rate=7.3e-4,
            buffer_size=300_000,
            ent_coef="auto",
            gamma=0.98,
            tau=0.02,
            train_freq=64,
            gradient_steps=64,
            learning_starts=10_000,
            use_sde=True,  # generalized state-dependent exploration; sac.py samples plain SAC
            log_std_init=-3,
            net_arch=[400, 300],
        ),
    },
}
MATCH = {"ddpg": "td3", "td3": "td3", "naf": "td3", "sac": "sac"}  # the SB3 algorithm each one is compared with
CHECKPOINTS_S = (60, 120, 300, 600, 900, 1200, 1800, 2400, 3600)  # equal training times of the report


def run_sb3(algo: str, env_id: str, seed: int, budget_s: float, stop_solved=False, steps=None) -> dict:
    from stable_baselines3 import SAC, TD3
    from stable_baselines3.common.noise import NormalActionNoise

    hp = dict(ZOO[algo][env_id])
    zoo_total = hp.pop("n_timesteps")
    total = steps or zoo_total
    policy = {k: hp.pop(k) for k in ("net_arch", "log_std_init") if k in hp}
    if policy:
        hp["policy_kwargs"] = policy
    if "noise_std" in hp:
        env = gym.make(env_id)
        n_act = env.action_space.shape[0]
        env.close()
        hp["action_noise"] = NormalActionNoise(np.zeros(n_act), hp.pop("noise_std") * np.ones(n_act))
    if isinstance(hp.get("learning_rate"), str):  # lin_X: X * progress_remaining over RL-Zoo's n_timesteps
        lr0 = float(hp["learning_rate"].removeprefix("lin_"))
        hp["learning_rate"] = lambda remaining: lr0 * max(0.0, 1 - (1 - remaining) * total / zoo_total)
    model = {"td3": TD3, "sac": SAC}[algo]("MlpPolicy", env_id, seed=seed, device="cpu", **hp)
    every, threshold = EVAL_EVERY[env_id], SOLVED[env_id]
    return dqn_bench.learn_sb3(model, env_id, seed, total, every, budget_s, stop_solved, f"sb3-{algo}", threshold)


def example_options(algo: str, noise: str) -> dict[str, str]:
    """The ``--set`` options that pick ``algo`` and ``noise`` in its file (sac.py has neither: it samples)."""
    options = {"algo": algo} if FILES[algo].name == "ddpg_td3.py" else {}
    return options | ({"noise": noise} if noise and algo != "sac" else {})


def parse_config(text: str) -> tuple[str, str]:
    """``algo[/noise]`` -> (algo, noise), the noise left out resolved (and the pair checked) by the example."""
    algo, _, noise = text.partition("/")
    assert algo in FILES, f"algo {algo}: choose one of {', '.join(FILES)}"
    assert algo != "sac" or noise in ("", "none"), f"{text}: sac explores by sampling its policy, use sac"
    exp = load_experiment(str(FILES[algo]), None, example_options(algo, noise))
    return algo, getattr(exp.args, "noise", "none")


def run_tinyverse(algo, noise, env_id, seed, budget_s, players=1, stop_solved=False, steps=None, extra=()):
    total = steps or ZOO[MATCH[algo]][env_id]["n_timesteps"]
    row = dqn_bench.run_tinyverse(
        env_id,
        seed,
        budget_s,
        players,
        f"{algo}/{noise}",
        stop_solved,
        total,
        extra,
        experiment=FILES[algo],
        options=example_options(algo, noise),
        eval_every=EVAL_EVERY[env_id],
        threshold=SOLVED[env_id],
    )
    exp = load_experiment(str(FILES[algo]), None, {**example_options(algo, noise), "env_id": env_id, **dict(extra)})
    batch = f"{exp.args.train_batch_size}x{exp.args.session_length}"  # sessions x ticks of a minibatch
    return row | {"algo": algo, "noise": noise, "options": dict(extra), "batch": batch}


# -- report ---------------------------------------------------------------------------
def group(r: dict) -> str:
    """A row's system and configuration: sb3-td3, sb3-sac, or the tinyverse config, minibatch (and players)."""
    if r["system"] != "tinyverse":
        return r["system"]
    return f"{r['config']} {batch(r)}" + (f" x{r['players']}" if r["players"] != 1 else "")


def batch(r: dict) -> str:
    """A tinyverse row's minibatch, sessions x ticks; rows written before the field ran 16 x 16 unless set."""
    if "batch" in r:
        return r["batch"]
    options = r.get("options", {})
    sessions = options.get("train_batch_size", options.get("batch_sessions", 16))  # the option's former name
    return f"{sessions}x{options.get('session_length', 16)}"


def names(runs: list[dict]) -> list[str]:
    """The groups of ``runs``, SB3's first, then in the order of the rows."""
    return sorted(dict.fromkeys(map(group, runs)), key=lambda g: not g.startswith("sb3-"))


def solved_median(runs: list[dict]) -> tuple[int, float | None, float | None]:
    """Seeds solved, and the median time and env steps to solve over those that did."""
    done = [r for r in runs if r["solved_s"] is not None]
    if not done:
        return 0, None, None
    return len(done), statistics.median(r["solved_s"] for r in done), statistics.median(r["solved_steps"] for r in done)


def at(run: dict, t: float) -> float | None:
    """The run's last eval return at or before training time ``t`` (its last one if it ended by then)."""
    seen = [score for when, _, score in run["evals"] if when <= t or run["wall_s"] <= t]
    return seen[-1] if seen else None


def show(rows: list[dict]) -> None:
    dqn_bench.show_runs(rows)
    for env_id in [e for e in ENVS if any(r["env"] == e for r in rows)]:
        mine = [r for r in rows if r["env"] == env_id]
        groups = {g: [r for r in mine if group(r) == g] for g in names(mine)}
        sb3 = {g.removeprefix("sb3-"): solved_median(runs)[1] for g, runs in groups.items() if g.startswith("sb3-")}
        print(f"\n{env_id}, solved at {SOLVED[env_id]:g}: median over the seeds that solved")
        cells = []
        for g, runs in groups.items():
            k, secs, steps = solved_median(runs)
            base = "-" if runs[0]["system"] != "tinyverse" else f"sb3-{MATCH[runs[0]['algo']]}"
            ref = sb3.get(base.removeprefix("sb3-"))
            ratio = f"{secs / ref:.2f}" if secs is not None and ref else "-"
            final = statistics.median(r["final"] for r in runs)
            secs_s, steps_s = ("-", "-") if secs is None else (f"{secs:.0f}", f"{steps:,.0f}")
            cells.append([g, f"{k}/{len(runs)}", secs_s, steps_s, f"{final:.1f}", base, ratio])
        dqn_bench.table(["system", "solved", "median s", "median steps", "median final", "vs", "time / vs"], cells)
        grid(env_id, [r for r in mine if r["system"] == "tinyverse"])
        best(env_id, groups, sb3)
    larger = [e for e in ENVS if any(r["env"] == e for r in rows)][-1:]
    for env_id in larger:
        equal_time(env_id, [r for r in rows if r["env"] == env_id])


def grid(env_id: str, runs: list[dict]) -> None:
    """Algorithm (and minibatch) x exploration: median time to solve (seeds solved / run), one player."""
    runs = [r for r in runs if r["players"] == 1]
    if not runs:
        return
    order = {a: i for i, a in enumerate(("ddpg", "td3", "sac", "naf"))}
    algos = sorted(dict.fromkeys((r["algo"], batch(r)) for r in runs), key=lambda k: (order[k[0]], k[1]))
    noises = [n for n in ("gaussian", "ou", "param", "none") if any(r["noise"] == n for r in runs)]
    cells = []
    for algo, size in algos:
        line = [f"{algo} {size}"]
        for noise in noises:
            these = [r for r in runs if (r["algo"], batch(r), r["noise"]) == (algo, size, noise)]
            k, secs, _ = solved_median(these)
            line.append("" if not these else f"{'-' if secs is None else f'{secs:.0f} s'} ({k}/{len(these)})")
        cells.append(line)
    print(f"\n{env_id}, tinyverse, 1 player: median time to solve (seeds solved)")
    dqn_bench.table(["algo \\ noise", *noises], cells)


def best(env_id: str, groups: dict[str, list[dict]], sb3: dict[str, float | None]) -> None:
    """The goal line: the best tinyverse configuration (every seed solving first) against the faster SB3."""
    ranked = []
    for g, runs in groups.items():
        k, secs, _ = solved_median(runs)
        if runs[0]["system"] == "tinyverse" and secs is not None:
            ranked.append((k < len(runs), secs, g, k, len(runs)))
    refs = {a: s for a, s in sb3.items() if s is not None}
    if not ranked:
        print(f"{env_id}: no tinyverse configuration solved")
        return
    _, secs, g, k, n = min(ranked)
    line = f"{env_id}: best tinyverse configuration {g}, {k}/{n} seeds solved, median {secs:.0f} s"
    if refs:
        fastest = min(refs, key=refs.get)
        line += f"; / sb3-{fastest}'s {refs[fastest]:.0f} s = {secs / refs[fastest]:.2f}"
    print(line)


def equal_time(env_id: str, runs: list[dict]) -> None:
    """Median eval return of each system and configuration at equal training times."""
    longest = max(r["wall_s"] for r in runs)
    times = [t for t in CHECKPOINTS_S if t < 0.99 * longest] + [longest]
    cells = []
    for g in names(runs):
        line = [g]
        for t in times:
            scores = [s for s in (at(r, t) for r in runs if group(r) == g) if s is not None]
            line.append(f"{statistics.median(scores):.0f}" if scores else "-")
        cells.append(line)
    print(f"\n{env_id}: median eval return at equal training time (s)")
    dqn_bench.table(["system", *(f"{t:.0f}" for t in times)], cells)


def curve(rows: list[dict], path: str) -> None:
    """Eval return against training time for the larger problem among the rows, one line a run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_id = [e for e in ENVS if any(r["env"] == e for r in rows)][-1]
    runs = [r for r in rows if r["env"] == env_id]
    fig, ax = plt.subplots(figsize=(8, 5))
    colors = {g: f"C{i}" for i, g in enumerate(names(runs))}
    for g, color in colors.items():
        for i, r in enumerate(x for x in runs if group(x) == g):
            ax.plot([e[0] for e in r["evals"]], [e[2] for e in r["evals"]], color=color, alpha=0.8, marker=".",
                    label=g if i == 0 else None, linestyle="--" if g.startswith("sb3-") else "-")  # fmt: skip
    ax.axhline(SOLVED[env_id], color="gray", linewidth=0.8, linestyle=":")
    ax.set(xlabel="training time, s (evaluation excluded)", ylabel="greedy eval return (10 episodes)", title=env_id)
    ax.legend()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    print(f"\n{env_id}: curve of {len(runs)} runs in {path}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default=",".join(ENVS), help="comma-separated env ids")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--budget-s", type=float, default=600.0, help="training-time cap of one run, seconds")
    p.add_argument("--systems", default="sb3-td3,sb3-sac,tinyverse", help="of sb3-td3, sb3-sac, tinyverse")
    p.add_argument("--configs", default="td3,sac", help="tinyverse configurations algo[/noise], comma-separated")
    p.add_argument("--players", default="1", help="tinyverse player counts to run, comma-separated")
    dqn_bench.run_arguments(p, "the example of each configuration")
    p.add_argument("--curve", metavar="PNG", help="draw eval return vs training time of the larger problem's runs")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench stops its tinyverse processes too
    if args.report:
        rows = [json.loads(line) for f in args.report for line in Path(f).read_text().splitlines() if line.strip()]
    else:
        rows = measure(args)
    print()
    show(rows)
    if args.curve:
        curve(rows, args.curve)


def measure(args) -> list[dict]:
    systems = args.systems.split(",")
    assert set(systems) <= {"sb3-td3", "sb3-sac", "tinyverse"}, f"unknown system in {args.systems}"
    configs = [parse_config(c) for c in args.configs.split(",")] if "tinyverse" in systems else []
    extra = [tuple(o.split("=", 1)) for o in args.options]
    rows = []
    for env_id in args.envs.split(","):
        assert env_id in SOLVED, f"no threshold for {env_id}: pick from {', '.join(SOLVED)}"
        for seed in map(int, args.seeds.split(",")):
            runs = [(s, None, 1) for s in systems if s != "tinyverse"]
            runs += [("tinyverse", c, int(n)) for c in configs for n in args.players.split(",")]
            for system, config, players in runs:
                label = system if config is None else f"tinyverse {'/'.join(config)} players={players}"
                print(f"# {env_id} seed {seed}: {label}", flush=True)
                if config is None:
                    algo = system.removeprefix("sb3-")
                    row = run_sb3(algo, env_id, seed, args.budget_s, args.stop_solved, args.steps)
                else:
                    row = run_tinyverse(
                        *config, env_id, seed, args.budget_s, players, args.stop_solved, args.steps, extra
                    )
                rows.append(dqn_bench.record(row, args.json))
    return rows


if __name__ == "__main__":
    main()
