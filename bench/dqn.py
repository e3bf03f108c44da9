"""Learning results: examples/dqn.py through tinyverse vs Stable-Baselines3 DQN (RL-Zoo hyperparameters).

    python bench/dqn.py --envs CartPole-v1 --seeds 0 --budget-s 300          # one quick pair
    python bench/dqn.py --envs CartPole-v1,Acrobot-v1,LunarLander-v3 --seeds 0,1,2 --players 1,2
    python bench/dqn.py --ablate --envs CartPole-v1 --seeds 0,1,2            # each improvement off in turn
    python bench/dqn.py --envs Acrobot-v1 --seeds 1 --json runs.jsonl         # rows also appended as JSON
    python bench/dqn.py --report runs.jsonl                                   # tables of saved rows
    python bench/dqn.py --envs Acrobot-v1 --seeds 0 --set pace_slack=500      # options of examples/dqn.py
    python bench/dqn.py --update-cost 8a4977c --envs LunarLander-v3          # an update now vs at a commit

Runs are sequential; on a machine with many cores, start one script per run with ``--json`` to the
same file and print the merged tables with ``--report``.

Both systems are judged alike: every ``eval_every`` env steps (and once at the end), 10 greedy
episodes on a separately seeded env; an env is solved at the first eval whose mean reaches the
threshold (CartPole-v1 475, Acrobot-v1 -100, LunarLander-v3 200). A run ends at RL-Zoo's
``n_timesteps`` (``--steps`` overrides it) or after ``--budget-s`` seconds of training time
(wall time less evaluation, see ``Tracker``), or with ``--stop-solved`` at the
first eval that solves.

- SB3: ``stable_baselines3.DQN`` in this process with RL-Zoo's hyperparameters
  (hyperparams/dqn.yml; LunarLander-v3 takes the v2 entry), one torch thread; the clock starts
  when the model is built (imports done).
- tinyverse: ``python -m tinyverse examples/dqn.py train`` and ``play`` (one per ``--players``)
  as real subprocesses on a fresh SQLite file, configured by ``--set`` options (env_id, seed, the
  ablation's switches, this script's ``--set``), each given to every process; this process polls
  the env step count and evaluates the stored params. The clock starts at the spawn, so process
  start-up (importing torch: seconds on a busy machine) counts against tinyverse.

On a machine with few cores, evals and all processes share them: compare ratios within one run.
"""

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import atari_learn
import gymnasium as gym
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tinyverse.database import connect  # noqa: E402
from tinyverse.loader import load_experiment  # noqa: E402

torch.set_num_threads(1)
DQN_FILE = ROOT / "examples" / "dqn.py"
SOLVED = {"CartPole-v1": 475.0, "Acrobot-v1": -100.0, "LunarLander-v3": 200.0}
EVAL_EVERY = {"CartPole-v1": 2500, "Acrobot-v1": 5000, "LunarLander-v3": 5000}
_LUNAR = dict(
    n_timesteps=100_000,
    learning_rate=6.3e-4,
    batch_size=128,
    buffer_size=50_000,
    learning_starts=0,
    gamma=0.99,
    target_update_interval=250,
    train_freq=4,
    gradient_steps=-1,
    exploration_fraction=0.12,
    exploration_final_eps=0.1,
)
ZOO = {  # rl-baselines3-zoo hyperparams/dqn.yml, all with policy_kwargs net_arch=[256, 256]
    "CartPole-v1": dict(
        n_timesteps=50_000,
        learning_rate=2.3e-3,
        batch_size=64,
        buffer_size=100_000,
        learning_starts=1000,
        gamma=0.99,
        target_update_interval=10,
        train_freq=256,
        gradient_steps=128,
        exploration_fraction=0.16,
        exploration_final_eps=0.04,
    ),
    "Acrobot-v1": _LUNAR,
    "LunarLander-v3": _LUNAR,
}
ABLATIONS = {  # name: --set options of examples/dqn.py
    "all": {},
    "no-double": {"double": "0"},
    "no-dueling": {"dueling": "0"},
    "1-step": {"n_step": "1"},
    "no-per": {"per": "0"},
    "none": {"double": "0", "dueling": "0", "n_step": "1", "per": "0"},
}


def evaluate(policy, env_id: str, seed: int, episodes: int = 10) -> float:
    """Mean return of ``episodes`` greedy episodes; ``policy`` maps a batch of observations to actions."""
    env = gym.make(env_id)
    discrete = isinstance(env.action_space, gym.spaces.Discrete)  # else a Box: the action array as it is
    returns = []
    for ep in range(episodes):
        obs, _ = env.reset(seed=10_000 + 100 * seed + ep)
        total, done = 0.0, False
        while not done:
            action = policy(obs[None])[0]
            obs, reward, terminated, truncated, _ = env.step(int(action) if discrete else action)
            total += float(reward)
            done = terminated or truncated
        returns.append(total)
    env.close()
    return float(np.mean(returns))


class Tracker:
    """Eval results of one run on a training clock that stops while evaluating.

    ``clock()`` is wall time since the start minus time spent in ``evaluate``: SB3 evaluates inside
    its training loop, and tinyverse's processes are SIGSTOPped while this process evaluates, so
    neither system is charged for (or helped by) evaluation.
    """

    def __init__(
        self, env_id: str, env_seed: int, pause=(), started: float | None = None, threshold: float | None = None
    ):
        self.env_id, self.env_seed, self.pause = env_id, env_seed, pause
        self.threshold, self.paused = SOLVED[env_id] if threshold is None else threshold, 0.0
        self.started = time.monotonic() if started is None else started
        self.solved_s = self.solved_steps = None
        self.evals: list[tuple[float, int, float]] = []

    def clock(self) -> float:
        return time.monotonic() - self.started - self.paused

    def evaluate(self, steps: int, policy) -> None:
        at = self.clock()
        for p in self.pause:
            p.send_signal(signal.SIGSTOP)
        try:
            score = evaluate(policy, self.env_id, self.env_seed)
        finally:
            for p in self.pause:
                p.send_signal(signal.SIGCONT)
            self.paused = time.monotonic() - self.started - at
        self.evals.append((at, steps, score))
        if self.solved_s is None and score >= self.threshold:
            self.solved_s, self.solved_steps = at, steps


def run_sb3(env_id: str, seed: int, budget_s: float, stop_solved: bool = False, steps: int | None = None) -> dict:
    from stable_baselines3 import DQN

    hp = dict(ZOO[env_id])
    zoo_total = hp.pop("n_timesteps")
    total = steps or zoo_total
    hp["exploration_fraction"] *= zoo_total / total  # the same decay in env steps as RL-Zoo's
    model = DQN("MlpPolicy", env_id, seed=seed, policy_kwargs=dict(net_arch=[256, 256]), device="cpu", **hp)
    return learn_sb3(model, env_id, seed, total, EVAL_EVERY[env_id], budget_s, stop_solved)


def learn_sb3(
    model, env_id, seed, total, every, budget_s, stop_solved, system="sb3", threshold: float | None = None
) -> dict:
    """Train a built SB3 ``model`` for ``total`` env steps (or ``budget_s``), evaluating every ``every``; its row."""
    from stable_baselines3.common.callbacks import BaseCallback

    class Eval(BaseCallback):
        def _on_step(self) -> bool:
            if self.num_timesteps % every == 0:
                tracker.evaluate(self.num_timesteps, policy)
                if stop_solved and tracker.solved_s is not None:
                    return False
            return tracker.clock() < budget_s

    policy = lambda obs: model.predict(obs, deterministic=True)[0]  # noqa: E731
    tracker = Tracker(env_id, seed, threshold=threshold)
    model.learn(total_timesteps=total, callback=Eval())
    wall = tracker.clock()
    if not tracker.evals or tracker.evals[-1][1] != model.num_timesteps:
        tracker.evaluate(model.num_timesteps, policy)
    return result(system, env_id, seed, 1, "-", tracker, model.num_timesteps, wall)


def run_tinyverse(
    env_id: str,
    seed: int,
    budget_s: float,
    players: int,
    config: str = "all",
    stop_solved: bool = False,
    max_steps: int | None = None,
    extra: list[tuple[str, str]] = (),
    trainers: int = 1,
    *,
    experiment: Path = DQN_FILE,
    options: dict[str, str] | None = None,
    eval_every: int | None = None,
    threshold: float | None = None,
) -> dict:
    """One run of ``experiment`` (default examples/dqn.py), its row labelled ``config``.

    Every process gets ``--set`` env_id, seed, ``options`` (default: the ablation ``config``'s switches), then
    ``extra``; ``eval_every`` and ``threshold`` default to this file's ``EVAL_EVERY`` and ``SOLVED``.
    """
    workdir = Path(tempfile.mkdtemp(prefix="tinyverse-bench-dqn-"))
    url = f"sqlite:///{workdir / 'bench.db'}"
    chosen = ABLATIONS.get(config, {}) if options is None else options
    options = {"env_id": env_id, "seed": str(seed), **chosen, **dict(extra)}
    sets = [a for k, v in options.items() for a in ("--set", f"{k}={v}")]
    total, every = max_steps or ZOO[env_id]["n_timesteps"], eval_every or EVAL_EVERY[env_id]
    base = [sys.executable, "-m", "tinyverse", str(experiment)]
    common = ["--db", url, "--prefix", "bench", "-q", *sets]  # every process: any may store the options first
    env = dict(os.environ)
    exp = load_experiment(str(experiment), None, options)  # this process's copy, for evaluation
    T = exp.run.settings.session_length
    names = [*(f"trainer-{i}" for i in range(trainers)), *(f"player-{i}" for i in range(players))]
    logs = [open(workdir / f"{name}.log", "wb") for name in names]
    started = time.monotonic()
    procs = [
        subprocess.Popen([*base, "train", *common], env=env, stdout=logs[i], stderr=subprocess.STDOUT)
        for i in range(trainers)
    ]
    for i in range(players):
        worker = {"TINYVERSE_WORKER_INDEX": str(i), "TINYVERSE_WORKER_COUNT": str(players)}
        argv = [*base, "play", "--seed", str(1000 * seed + i), *common]
        procs.append(subprocess.Popen(argv, env={**env, **worker}, stdout=logs[trainers + i], stderr=subprocess.STDOUT))
    db = connect(url, "bench", retry_for=30)
    tracker, next_eval, steps, version = Tracker(env_id, seed, procs, started, threshold), every, 0, None

    def policy(obs):
        return exp.act(obs, {}, greedy=True)[0]

    try:
        while tracker.clock() < budget_s and steps < total:
            if stop_solved and tracker.solved_s is not None:
                break
            if any(p.poll() is not None for p in procs):
                raise RuntimeError(f"a tinyverse process died; see the logs in {workdir}")
            time.sleep(0.2)
            steps = db.count_sessions()[1] * T
            if steps >= next_eval:
                found = db.load_params()
                if found is not None:
                    version = found[0]
                    exp.set_params(found[1])
                    tracker.evaluate(steps, policy)
                next_eval = (steps // every + 1) * every
    finally:
        wall = tracker.clock()
        for p in procs:
            p.send_signal(signal.SIGTERM)  # warm shutdown: the trainer publishes its last params
        for p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in logs:
            f.close()
    steps = db.count_sessions()[1] * T
    found = db.load_params()
    if found is not None and found[0] != version:
        exp.set_params(found[1])
        tracker.evaluate(steps, policy)
    updates = int(found[1]["updates"]) if found is not None else 0
    last = {m["worker"]: m for m in db.metrics("train") if "worker" in m}  # each trainer's last report
    pushes = {k: sum(m[k] for m in last.values()) for k in ("push_s", "pushes", "push_conflicts")}
    db.close()
    shutil.rmtree(workdir)  # kept, with the logs, only when a process died
    out = result("tinyverse", env_id, seed, players, config, tracker, steps, wall)
    out |= {"updates": updates, "trainers": trainers, **pushes}
    return out


def result(system, env_id, seed, players, config, tracker: Tracker, steps: int, wall: float) -> dict:
    return {
        "system": system,
        "env": env_id,
        "seed": seed,
        "players": players,
        "config": config,
        "solved_s": tracker.solved_s,
        "solved_steps": tracker.solved_steps,
        "final": tracker.evals[-1][2] if tracker.evals else float("nan"),
        "best": max((e[2] for e in tracker.evals), default=float("nan")),
        "steps": steps,
        "wall_s": wall,
        "evals": tracker.evals,
    }


def table(head: list[str], cells: list[list[str]]) -> None:
    """Print a Markdown table: ``head`` left-aligned, the cells right-aligned."""
    widths = [max(len(x) for x in col) for col in zip(head, *cells, strict=True)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(head, widths, strict=True)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for c in cells:
        print("| " + " | ".join(x.rjust(w) for x, w in zip(c, widths, strict=True)) + " |")


def show_runs(rows: list[dict]) -> None:
    """The table of runs, one row each."""
    head = ["env", "system", "players", "config", "seed", "solved s", "solved steps", "final", "best", "steps"]
    head.append("wall s")
    cells = [
        [
            r["env"],
            r["system"],
            str(r["players"]),
            r["config"],
            str(r["seed"]),
            "-" if r["solved_s"] is None else f"{r['solved_s']:.0f}",
            "-" if r["solved_steps"] is None else f"{r['solved_steps']:,}",
            f"{r['final']:.1f}",
            f"{r['best']:.1f}",
            f"{r['steps']:,}",
            f"{r['wall_s']:.0f}",
        ]
        for r in rows
    ]
    table(head, cells)


def show(rows: list[dict]) -> None:
    show_runs(rows)
    # time to solve against SB3, per env and tinyverse setting (median over seeds that solved)
    for env_id in dict.fromkeys(r["env"] for r in rows):
        sb3 = [r["solved_s"] for r in rows if r["env"] == env_id and r["system"] == "sb3" and r["solved_s"]]
        sb3_steps = [r["solved_steps"] for r in rows if r["env"] == env_id and r["system"] == "sb3" and r["solved_s"]]
        if sb3:
            n = len([r for r in rows if r["env"] == env_id and r["system"] == "sb3"])
            print(
                f"{env_id} SB3: solved {len(sb3)}/{n} seeds, median {statistics.median(sb3):.0f} s / "
                f"{statistics.median(sb3_steps):,.0f} steps"
            )
        for key in dict.fromkeys((r["players"], r["config"]) for r in rows if r["system"] == "tinyverse"):
            mine = [r for r in rows if r["env"] == env_id and r["system"] == "tinyverse"]
            mine = [r for r in mine if (r["players"], r["config"]) == key]
            solved = [r["solved_s"] for r in mine if r["solved_s"]]
            if not mine:
                continue
            line = f"{env_id} tinyverse {key[0]} player(s), {key[1]}: solved {len(solved)}/{len(mine)} seeds"
            if solved:
                steps = statistics.median(r["solved_steps"] for r in mine if r["solved_s"])
                line += f", median {statistics.median(solved):.0f} s / {steps:,.0f} steps"
            if solved and sb3:
                line += f", time to solve / SB3's = {statistics.median(solved) / statistics.median(sb3):.2f}"
            print(line)


def update_cost(rev: str, env_ids: list[str], updates: int = 300) -> None:
    """Time ``train_step`` of examples/dqn.py at ``rev`` and in the working tree, interleaved, on one batch."""
    import importlib.util

    sys.path.insert(0, str(ROOT / "examples"))  # dqn.py imports its neighbour common.py
    old = Path(tempfile.mkdtemp()) / "dqn_old.py"
    old.write_text(subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:examples/dqn.py"], capture_output=True,
                                  text=True, check=True).stdout)  # fmt: skip
    modules = {}
    for name, path in (("then", old), ("now", DQN_FILE)):
        spec = importlib.util.spec_from_file_location(f"dqn_{name}", path)
        modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(modules[name])
    for env_id in env_ids:
        exps = {k: m.DQN(args=m.Args(env_id=env_id, per=False)) for k, m in modules.items()}  # any revision
        for exp in exps.values():
            exp.prepare_training()
        a, T = exps["now"].args, exps["now"].args.session_length
        env = gym.make(env_id)
        B, n_obs = a.train_batch_size, env.observation_space.shape[0]
        rng = np.random.default_rng(0)
        batch = {"observations": rng.normal(size=(B, T + 1, n_obs)).astype(np.float32),
                 "final_observations": rng.normal(size=(B, T, n_obs)).astype(np.float32),
                 "actions": rng.integers(0, env.action_space.n, (B, T)), "rewards": rng.normal(size=(B, T)).astype(
                 np.float32), "terminated": rng.random((B, T)) < 0.02, "truncated": np.zeros((B, T), bool)}  # fmt: skip
        spent = dict.fromkeys(exps, 0.0)
        for _ in range(updates):
            for k, exp in exps.items():
                t0 = time.perf_counter()
                exp.train_step(batch)
                spent[k] += time.perf_counter() - t0
        ms = {k: 1000 * v / updates for k, v in spent.items()}
        print(f"{env_id}: {B} sessions x {T} ticks, one update: {ms['then']:.2f} ms at {rev}, {ms['now']:.2f} ms now "
              f"(now / then = {ms['now'] / ms['then']:.2f}; mean of {updates}, interleaved)")  # fmt: skip


def run_arguments(p: argparse.ArgumentParser, example: str) -> None:
    """The options of a run and its rows: --steps, --stop-solved, --json, --set (of ``example``), --report."""
    p.add_argument("--steps", type=int, help="env steps of a run (default: RL-Zoo's n_timesteps)")
    p.add_argument("--stop-solved", action="store_true", help="end each run at its first solving eval")
    p.add_argument("--json", metavar="FILE", help="also append each run's row to FILE as a JSON line")
    p.add_argument(
        "--set",
        dest="options",
        metavar="NAME=VALUE",
        action="append",
        default=[],
        help=f"an option of {example} for the tinyverse runs (repeat for more)",
    )
    p.add_argument("--report", nargs="+", metavar="FILE", help="print tables of rows saved by --json")


def record(row: dict, path: str | None) -> dict:
    """Append ``row`` to the JSON lines file ``path`` (if any), print its evals; the row."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(row) + "\n")
    evals = " ".join(f"{s:,}:{v:.0f}" for _, s, v in row["evals"])
    print(f"  evals (steps:score) {evals}", flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", default="CartPole-v1,Acrobot-v1,LunarLander-v3", help="comma-separated env ids")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--budget-s", type=float, default=600.0, help="wall-clock cap of one run, seconds")
    p.add_argument("--players", default="1,2", help="tinyverse player counts to run, comma-separated")
    p.add_argument("--systems", default="sb3,tinyverse", help="comma-separated: sb3, tinyverse")
    p.add_argument("--ablate", action="store_true", help="tinyverse only, 1 player: each improvement off in turn")
    p.add_argument("--configs", default=",".join(ABLATIONS), help="with --ablate: which configs, comma-separated")
    run_arguments(p, "examples/dqn.py")
    p.add_argument("--update-cost", metavar="REV", help="time one update now against the one at git REV")
    args = p.parse_args()
    if args.update_cost:
        return update_cost(args.update_cost, args.envs.split(","))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed bench stops its tinyverse processes too
    if args.report:
        show([json.loads(line) for f in args.report for line in Path(f).read_text().splitlines() if line.strip()])
        return
    extra = [tuple(o.split("=", 1)) for o in args.options]
    rows, commit = [], atari_learn.commit()  # the code the runs start from
    for env_id in args.envs.split(","):
        assert env_id in ZOO, f"no preset for {env_id}: pick from {', '.join(ZOO)}"
        for seed in map(int, args.seeds.split(",")):
            if args.ablate:
                runs = [("tinyverse", 1, config) for config in args.configs.split(",")]
            else:
                runs = [("sb3", 1, "-")] if "sb3" in args.systems else []
                if "tinyverse" in args.systems:
                    named = " ".join(f"{k}={v}" for k, v in extra) or "all"  # --set options name the config
                    runs += [("tinyverse", int(n), named) for n in args.players.split(",")]
            for system, players, config in runs:
                print(f"# {env_id} seed {seed}: {system} players={players} config={config}", flush=True)
                if system == "sb3":
                    row = run_sb3(env_id, seed, args.budget_s, args.stop_solved, args.steps)
                else:
                    row = run_tinyverse(
                        env_id, seed, args.budget_s, players, config, args.stop_solved, args.steps, extra
                    )
                rows.append(record(row | {"commit": commit}, args.json))
    print()
    show(rows)


if __name__ == "__main__":
    main()
