"""Trainer updates/s of examples/cartpole_dqn.py with the prefetch thread vs fetching in the training thread.

    python bench/prefetch.py [--steps 1500] [--reps 3]

Fills an SQLite file with 2,500 CartPole-sized sessions, turns the example's pacing off, and
runs ``tinyverse.trainer.train`` with the setting ``prefetch`` = 2 (a background thread) and 0
(batches fetched in the training thread), alternating, in one process. Prints updates/s and
the ratio sync/thread for each repetition.
"""

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tinyverse.database import connect  # noqa: E402
from tinyverse.loader import load_experiment  # noqa: E402
from tinyverse.trainer import train  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="updates per measurement")
    parser.add_argument("--reps", type=int, default=3, help="alternations")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    db = connect(f"sqlite:///{tempfile.mkdtemp()}/prefetch.db", "bench")
    exp = load_experiment(str(ROOT / "examples" / "cartpole_dqn.py"), db)
    exp.args.updates_per_step = None  # no pacing: measure the training loop alone
    exp.args.learning_starts = 0
    T = exp.args.session_length
    session = {
        "observations": np.random.rand(T + 1, 4).astype(np.float32),
        "final_observations": np.zeros((T, 4), np.float32),
        "actions": np.zeros(T, np.int64),
        "rewards": np.ones(T, np.float32),
        "terminated": np.zeros(T, bool),
        "truncated": np.zeros(T, bool),
        "version": np.int64(1),
        "worker": np.int64(1),
    }
    db.add_sessions([session] * 2500, capacity=2500)
    for rep in range(args.reps):
        rates = {}
        for depth in (2, 0):
            exp.args.prefetch = depth  # the options are where the trainer reads it
            start = time.perf_counter()
            train(exp, db, exp.args.train_batch_size, updates=args.steps, save_every=10**9, report_every=1e9)
            rates[depth] = args.steps / (time.perf_counter() - start)
        print(
            f"rep {rep}: thread {rates[2]:.0f} updates/s, in the training thread {rates[0]:.0f}: "
            f"ratio {rates[0] / rates[2]:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
