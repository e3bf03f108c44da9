"""Wall time to solve CartPole-v1: examples/cartpole_dqn.py through tinyverse vs Stable-Baselines3 DQN.

    python bench/cartpole.py                          # 3 seeds, 180 s budget each run
    python bench/cartpole.py --seeds 0 --budget-s 120
    python bench/cartpole.py --set updates_per_step=0.5    # options of cartpole_dqn.py (play and train)
    python bench/cartpole.py --lockstep --seeds 0-19 --set hidden=128   # env steps to solve, no clock
    python bench/cartpole.py --lockstep --seeds 0-7 --stay-steps 150000  # and does it stay solved?

Solved means: the first 20-episode greedy eval with mean return >= 475. Each run ends when solved
or when its training clock passes ``--budget-s``. Runs go one at a time, never side by side.

- SB3: ``stable_baselines3.DQN`` in this process, RL-Zoo hyperparameters (hyperparams/dqn.yml,
  CartPole-v1), one torch thread, seeded. The zoo decays epsilon over 16% of 50k steps; the run
  is given room to go on past 50k (total_timesteps 10^6, exploration_fraction scaled to decay
  over the same 8k steps), so a seed that is late is not cut off by the zoo's step count.
- tinyverse: ``python -m tinyverse examples/cartpole_dqn.py play -b 1 --seed S`` and
  ``train -b 16`` as real subprocesses in a fresh temp dir, on the default SQLite file there.
  The clock starts at the spawn: start-up (importing torch in two processes) counts against it.

Evaluation cost: both are evaluated every ``--eval-every-s`` seconds of their training clock, on
the same 20 episode seeds (``--eval-episodes``), with the same greedy loop in this process
(``bench/peers/judge.py``'s, which ``bench/peers.py`` plays for Sample Factory and RLlib). Evaluation time is NOT
counted on either clock: SB3 is paused by construction (its eval runs inside a callback), and the
tinyverse player and trainer are paused with SIGSTOP while this process loads the latest params
from the database and plays (SIGCONT after). A solve time is the training clock when the params
that passed were taken; its resolution is the eval period. Env steps are the player's (sessions
ever added x session_length) or SB3's ``num_timesteps`` at that moment.

``--lockstep`` asks how many env steps the learner needs, without the clock's noise or the 3 s
resolution, on more seeds than a wall-clock run affords (``--jobs`` at once): the example's hooks in
one process on a SQLite file, no subprocess. The core's player records a session of one game, the
trainer then makes the updates the declared pace allows (``updates_per_step`` after
``learning_starts``) on batches the example samples (``train_batch_size`` sessions), and hands its params to
the player every ``save_every`` updates, as its publications would (``--save-every`` overrides it);
every ``--eval-every-steps`` env steps the player's params face the same greedy eval. With
``--stay-steps N`` a solved run goes on N env steps more, evaluated as often, and the table says how
many of those evals held 475 (``held``), the lowest, the last, and each in turn (``#`` 475 or more,
``+`` 300 or more, ``.`` less): a lone player's view of what ``bench/stays.py`` asks of a fleet.
"""

import argparse
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tinyverse import sync_params  # noqa: E402
from tinyverse.database import connect  # noqa: E402
from tinyverse.loader import load_experiment  # noqa: E402

sys.path.insert(0, str(ROOT / "bench" / "peers"))
import judge  # noqa: E402  (the greedy eval, the same code for bench/peers.py's Sample Factory and RLlib)

torch.set_num_threads(1)  # torch's default thread count made a DQN run 4x slower with several processes on 2 cores
EXAMPLE = ROOT / "examples" / "cartpole_dqn.py"
SOLVED, EPISODES = judge.SOLVED, 20
ZOO = dict(  # rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 (n_timesteps 5e4)
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
    policy_kwargs=dict(net_arch=[256, 256]),
)


def evaluate(act, seed: int) -> float:
    """Mean return of EPISODES greedy episodes (``--eval-episodes``); ``act(obs) -> action``."""
    return judge.evaluate(act, seed, EPISODES)


def greedy(exp):
    """``act(obs) -> action`` of an experiment's greedy policy, as :func:`evaluate` takes it."""
    return lambda obs: int(exp.act(obs[None], {}, greedy=True)[0][0])


def run_sb3(seed: int, budget_s: float, eval_every_s: float) -> dict:
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    class Judge(BaseCallback):
        """Evaluates every ``eval_every_s`` s of training clock, which stops during evals."""

        def __init__(self, start: float):
            super().__init__()
            self.start, self.paused, self.next_eval, self.result = start, 0.0, eval_every_s, {}

        def _on_step(self) -> bool:
            stop = time.monotonic()
            clock = stop - self.start - self.paused
            if clock < self.next_eval:
                return True
            q_net = self.model.policy.q_net

            @torch.no_grad()
            def act(obs):
                return int(q_net(torch.as_tensor(obs[None], dtype=torch.float32)).argmax())

            mean, steps = evaluate(act, seed), self.model.num_timesteps
            self.paused += time.monotonic() - stop
            self.next_eval += eval_every_s
            print(f"  sb3 seed {seed}: {clock:6.1f}s {steps:6d} steps  eval {mean:5.1f}", flush=True)
            if mean >= SOLVED:
                self.result = dict(steps=steps, seconds=clock, eval=mean)
                return False
            return clock < budget_s

    start = time.monotonic()  # model building counts, imports do not
    total = 1_000_000
    hp = dict(ZOO, exploration_fraction=ZOO["exploration_fraction"] * 50_000 / total)
    model = DQN("MlpPolicy", gym.make("CartPole-v1"), seed=seed, device="cpu", verbose=0, **hp)
    judge = Judge(start)
    model.learn(total, callback=judge)
    return judge.result


def run_tinyverse(
    seed: int, budget_s: float, eval_every_s: float, play_b: int, train_b: int, options: list[str] = ()
) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cartpole-"))
    env = {k: v for k, v in os.environ.items() if k != "TINYVERSE_DB"}  # the default: ./tinyverse.db
    cmd = [sys.executable, "-m", "tinyverse", str(EXAMPLE)]
    sets = [a for o in options for a in ("--set", o)]  # both get them: either may store the run's options first
    logs = [open(workdir / f"{role}.log", "w") for role in ("play", "train")]
    start = time.monotonic()
    procs = [
        subprocess.Popen(
            [*cmd, "play", "-b", str(play_b), "--seed", str(seed), *sets], cwd=workdir, env=env, stderr=logs[0]
        ),
        subprocess.Popen([*cmd, "train", "-b", str(train_b), *sets], cwd=workdir, env=env, stderr=logs[1]),
    ]
    paused, result = 0.0, {}
    try:
        db = connect(f"sqlite:///{workdir / 'tinyverse.db'}", EXAMPLE.stem, retry_for=30)
        exp, version = load_experiment(str(EXAMPLE), db, dict(o.split("=", 1) for o in options)), None
        while True:
            clock = time.monotonic() - start - paused
            time.sleep(max(0.0, eval_every_s * (int(clock / eval_every_s) + 1) - clock))
            if any(p.poll() is not None for p in procs):
                tails = "".join((workdir / f"{r}.log").read_text()[-2000:] for r in ("play", "train"))
                raise RuntimeError(f"a tinyverse process exited early:\n{tails}")
            stop = time.monotonic()
            for p in procs:
                p.send_signal(signal.SIGSTOP)
            try:
                clock = stop - start - paused
                version = sync_params(exp, db, version)
                steps = db.count_sessions()[1] * exp.run.settings.session_length
                mean = evaluate(greedy(exp), seed)
            finally:
                for p in procs:
                    p.send_signal(signal.SIGCONT)
                paused += time.monotonic() - stop
            print(f"  tinyverse seed {seed}: {clock:6.1f}s {steps:6d} steps  eval {mean:5.1f}  v{version}", flush=True)
            if mean >= SOLVED:
                result = dict(steps=steps, seconds=clock, eval=mean)
                break
            if clock >= budget_s:
                break
    finally:
        for p in procs:
            p.send_signal(signal.SIGCONT)
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        for f in logs:
            f.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return result


def run_lockstep(
    seed: int, options: list[str], eval_every_steps: int, max_steps: int, save_every: int | None, stay_steps: int = 0
) -> dict:
    """Env steps (and updates) to solve, the player and the trainer in lock step at the pace; {} if not solved.

    With ``stay_steps`` the run goes on that many env steps past the first solve, and ``after`` holds the
    evals it met on the way."""
    import random

    from tinyverse.player import Player

    random.seed(seed), np.random.seed(seed), torch.manual_seed(seed)
    os.environ |= {"TINYVERSE_WORKER_INDEX": "0", "TINYVERSE_WORKER_COUNT": "1"}  # a lone player's epsilon
    workdir = Path(tempfile.mkdtemp(prefix="bench-lockstep-"))
    try:
        db = connect(f"sqlite:///{workdir / 'lockstep.db'}", EXAMPLE.stem)
        given = dict(o.split("=", 1) for o in options)
        exp, trainer = (load_experiment(str(EXAMPLE), db, given) for _ in range(2))
        exp.rng = np.random.default_rng(seed)
        trainer.set_params(exp.get_params())
        trainer.prepare_training()
        s = exp.run.settings  # the run's settings, as the loops read them
        player, save_every = Player(exp, db, 1, seed, 1, 10.0), save_every or s.save_every
        player.start()  # its environments
        steps = updates = handed = 0
        solved, after, act = {}, [], greedy(exp)
        while steps < (solved["steps"] + stay_steps if solved else max_steps):
            player.record()  # the core's play loop: one session into the database
            steps += s.session_length
            for _ in range(int(max(0, steps - s.learning_starts) * s.updates_per_step) - updates):
                trainer.run._updates = updates  # as the core's trainer sets it before an update
                updates += 1
                trainer.train_step(trainer.sample(db, s.train_batch_size))
            if updates // save_every > handed // save_every:
                exp.set_params(trainer.get_params())
                handed = updates
            if steps % eval_every_steps < s.session_length:
                mean = evaluate(act, seed)
                if solved:
                    after.append(mean)
                elif mean >= SOLVED:
                    solved = dict(steps=steps, updates=updates)
                    if not stay_steps:
                        break
        return solved and solved | ({"after": after} if stay_steps else {})
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def lockstep(
    seeds: list[int], options: list[str], eval_every_steps: int, max_steps: int, jobs: int, save_every, stay_steps=0
) -> int:
    from concurrent.futures import ProcessPoolExecutor

    every = f"params handed over every {save_every or 'save_every'} updates"
    stay = f"; then {stay_steps} env steps more" if stay_steps else ""
    print(
        f"{EXAMPLE.name} {' '.join(options)}: env steps to solve in lock step, {every}, evals every {eval_every_steps}"
        + stay
    )
    args = (options, eval_every_steps, max_steps, save_every, stay_steps)
    with ProcessPoolExecutor(jobs) as pool:
        results = [r.result() for r in [pool.submit(run_lockstep, s, *args) for s in seeds]]
    stay_columns = f" {'held':>7} {'lowest':>7} {'last':>6}" if stay_steps else ""
    print(f"{'seed':>4} {'steps':>8} {'updates':>8}{stay_columns}")
    for seed, r in zip(seeds, results, strict=True):
        line = f"{seed:>4} {r.get('steps', '-'):>8} {r.get('updates', '-'):>8}"
        if r.get("after"):  # evals after the first solve at SOLVED or more, of all of them
            held = f"{sum(m >= SOLVED for m in r['after'])}/{len(r['after'])}"
            trace = "".join("#" if m >= SOLVED else "+" if m >= 300 else "." for m in r["after"])
            line += f" {held:>7} {min(r['after']):>7.1f} {r['after'][-1]:>6.1f}  {trace}"
        print(line)
    steps = sorted(r.get("steps", math.inf) for r in results)
    solved = f"solved {sum(map(bool, results))}/{len(results)}"
    print(f"median {statistics.median(steps):g}, worst {steps[-1]:g} env steps; {solved}")
    if stay_steps:
        lasts = [r["after"][-1] for r in results if r.get("after")]
        print(f"after {stay_steps} env steps more: {sum(m >= SOLVED for m in lasts)}/{len(results)} still solved")
    return 0


def main(argv: list[str] | None = None) -> int:
    global EPISODES
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds or spans (default 0,1,2; 0-19)")
    parser.add_argument("--budget-s", type=float, default=180.0, help="training seconds per run (default 180)")
    parser.add_argument("--eval-every-s", type=float, default=3.0, help="training seconds between evals (default 3)")
    parser.add_argument("--play-b", type=int, default=1, help="tinyverse player: environments (play -b)")
    parser.add_argument("--train-b", type=int, default=16, help="tinyverse trainer: sessions a batch (train -b)")
    parser.add_argument(
        "--set", dest="options", metavar="NAME=VALUE", action="append", default=[], help="an option of the example"
    )
    parser.add_argument("--eval-episodes", type=int, default=EPISODES, help="greedy episodes an eval (default 20)")
    parser.add_argument("--only", choices=["sb3", "tinyverse"], help="run one system alone (no ratio)")
    parser.add_argument("--lockstep", action="store_true", help="env steps to solve, in one process, no clock")
    parser.add_argument("--eval-every-steps", type=int, default=3000, help="--lockstep: env steps between evals")
    parser.add_argument("--max-steps", type=int, default=150_000, help="--lockstep: env steps before giving up")
    parser.add_argument("--jobs", type=int, default=2, help="--lockstep: seeds at once (default 2)")
    parser.add_argument("--save-every", type=int, help="--lockstep: updates between params handed to the player")
    parser.add_argument("--stay-steps", type=int, default=0, help="--lockstep: env steps to go on after solving")
    args = parser.parse_args(argv)
    EPISODES = args.eval_episodes  # bench/peers.py's CartPole evals take 10 by default: pass 10 to compare
    seeds = [int(x) for part in args.seeds.split(",") for x in _span(part)]
    if args.lockstep:
        return lockstep(
            seeds, args.options, args.eval_every_steps, args.max_steps, args.jobs, args.save_every, args.stay_steps
        )
    rows = []
    for seed in seeds:
        sb3 = tv = None
        if args.only != "tinyverse":
            print(f"seed {seed}: Stable-Baselines3 DQN", flush=True)
            sb3 = run_sb3(seed, args.budget_s, args.eval_every_s)
        if args.only != "sb3":
            print(f"seed {seed}: tinyverse {EXAMPLE.name}", flush=True)
            tv = run_tinyverse(seed, args.budget_s, args.eval_every_s, args.play_b, args.train_b, args.options)
        rows.append((seed, sb3, tv))

    def cell(r):  # None: not run; {}: not solved within the budget
        if r is None:
            return f"{'n/a':>8} {'':>7}"
        return f"{r['steps']:>8d} {r['seconds']:>7.1f}" if r else f"{'-':>8} {'>' + str(int(args.budget_s)):>7}"

    print(f"\nCartPole-v1, first {EPISODES}-episode greedy eval >= {SOLVED:.0f}; evals every {args.eval_every_s:g} s")
    print(f"{'':4} {'SB3 DQN (zoo)':>16} {'tinyverse':>16}")
    print(f"{'seed':>4} {'steps':>8} {'s':>7} {'steps':>8} {'s':>7} {'ratio s':>8}")
    ratios = []
    for seed, sb3, tv in rows:
        ratio = ""
        if sb3 is not None and tv is not None:
            # an unsolved run counts as its budget: the ratio is then a bound, marked < or >
            t, s = (r["seconds"] if r else args.budget_s for r in (tv, sb3))
            ratios.append(t / s)
            ratio = ("<" if sb3 == {} and tv else ">" if tv == {} and sb3 else "") + f"{t / s:.2f}"
        print(f"{seed:>4} {cell(sb3)} {cell(tv)} {ratio:>8}")
    if ratios:
        print(f"median ratio tinyverse/SB3 (wall seconds): {statistics.median(ratios):.2f}")
    for name, col in (("SB3", 1), ("tinyverse", 2)):
        ran = [r[col] for r in rows if r[col] is not None]
        if ran:
            print(f"{name} solved {sum(map(bool, ran))}/{len(ran)}")
    return 0


def _span(part: str) -> range:
    """``3`` or ``0-19``, as --seeds takes them."""
    lo, _, hi = part.partition("-")
    return range(int(lo), int(hi or lo) + 1)


if __name__ == "__main__":
    sys.exit(main())
