"""How far to trust ``run``'s verdict: the greedy eval that reached the target against the final eval of the
same params (the snapshot ``passed``), for ``--target-passes`` K, on examples/cartpole_dqn.py.

    python bench/verdict.py                                  # K = 1, 2, 3; 4 runs each
    python bench/verdict.py --passes 1 3 --runs 6 --target 475 --target-eval 10
    python bench/verdict.py --experiment examples/dqn.py --set env_id=LunarLander-v3 --target 200 --passes 1 --runs 1

Each run is ``python -m tinyverse examples/cartpole_dqn.py run --target-eval N --target-return X
--target-passes K -n STEPS`` in a fresh temp dir (its own SQLite file), one at a time. Printed per run: the
wall time, env steps, the greedy evals it made (mean return of each, ``*`` at or over the target), the version
that passed, the passing mean and the final eval's (10 fresh episodes of the very same params), and whether run
warned that the two differ by more than their spread. A run that never passes within ``-n`` env steps counts as
not solved. Results go to ``--out`` as JSON lines too.
"""

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tinyverse.database import connect

ROOT = Path(__file__).resolve().parent.parent
EVAL = re.compile(r"greedy eval of params v(\d+): mean return (\S+) ± (\S+) over (\d+) episodes")
VERDICT = re.compile(r"verdict on params v(\d+) \(snapshot passed\): (\S+) ± (\S+) over \d+ episodes in the greedy "
                     r"eval; (\S+) ± (\S+) over (\d+) episodes in the final eval")  # fmt: skip


def one_run(passes: int, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="tv-verdict-") as tmp:
        experiment = Path(args.experiment).resolve()
        cmd = [sys.executable, "-m", "tinyverse", str(experiment), "run", *[a for s in args.set for a in ("--set", s)]]
        cmd += ["--target-eval", str(args.target_eval), "--target-return", str(args.target)]
        cmd += ["--target-passes", str(passes), "-n", str(args.steps), "--db", f"sqlite:///{tmp}/run.db"]
        started = time.monotonic()
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, timeout=args.timeout)
        wall = time.monotonic() - started
        db = connect(f"sqlite:///{tmp}/run.db", experiment.stem, retry_for=5)
        env_steps = db.env_steps(args.session_length)
        db.close()
    evals = [float(m[2]) for m in EVAL.finditer(proc.stderr)]
    found = VERDICT.search(proc.stdout)
    result = {"experiment": experiment.name, "sets": args.set, "target": args.target}
    result |= {"passes": passes, "wall_s": round(wall, 1), "rc": proc.returncode, "evals": evals}
    result["env_steps"] = env_steps
    result["warned"] = "differs from the verdict by more than their spread" in proc.stderr
    if found:
        result |= {"version": int(found[1]), "passed": float(found[2]), "passed_std": float(found[3])}
        result |= {"final": float(found[4]), "final_std": float(found[5])}
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passes", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--target", type=float, default=475)
    parser.add_argument("--target-eval", type=int, default=10)
    parser.add_argument("--steps", type=int, default=300_000)
    parser.add_argument("--experiment", default=str(ROOT / "examples" / "cartpole_dqn.py"))
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="an option of the experiment")
    parser.add_argument("--session-length", type=int, default=32, help="the experiment's, to count env steps")
    parser.add_argument("--timeout", type=float, default=1200)
    parser.add_argument("--out", default="verdict.jsonl")
    args = parser.parse_args()
    with open(args.out, "a") as out:
        for passes in args.passes:
            for _ in range(args.runs):
                r = one_run(passes, args)
                out.write(json.dumps(r) + "\n")
                out.flush()
                shown = " ".join(f"{e:g}{'*' if e >= args.target else ''}" for e in r["evals"])
                run = f"K={passes} {r['wall_s']:6.1f}s {r['env_steps']:>7,} steps"
                print(f"{run}  evals [{shown}]  {said(r)}", flush=True)


def said(r: dict) -> str:
    """The verdict of a run, and the final eval of its params."""
    if "final" not in r:
        return "not solved"
    passed = f"v{r['version']} passed {r['passed']:g} ± {r['passed_std']:g}"
    return f"{passed}, final {r['final']:g} ± {r['final_std']:g}{' WARNED' if r['warned'] else ''}"


if __name__ == "__main__":
    main()
