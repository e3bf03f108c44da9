"""A game's learning, judged by matches: ``run`` an experiment of games (examples/alphazero.py, examples/go.py) for
M minutes on a fresh SQLite file, then ``eval --opponent`` its greedy agent (the latest params) against fixed
opponents, colours alternated by the env, each match's score with its 95% interval; a row of JSON a run appends to
``--out``.

    python bench/games.py examples/alphazero.py --minutes 60 --set game=connect_four --match mcts:1000=100
    python bench/games.py examples/go.py --minutes 30 --match random=200 --match mcts:200=100

``--minutes 0 --keep FOLDER`` judges what an earlier run left in FOLDER. ``--match NAME=GAMES`` (repeatable) is an
opponent and the games against it. The run is ``python -m tinyverse EXP
run --eval-episodes 0`` with the example's defaults and the given ``--set``s; after M minutes the script sends it
Ctrl-C (SIGINT: the workers stop, the trainer publishes), so the agent judged is the one M minutes of training left.
The ratings ``info`` shows at the end (league games and these matches) are printed and stored with the row.
"""

import argparse
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MATCH = re.compile(
    r"against (\S+): (\d+) won, (\d+) drawn, (\d+) lost of (\d+): score (\S+) \(95% interval (\S+)-(\S+)\)"
)
ROOT = Path(__file__).resolve().parent.parent


def tinyverse(*args) -> list[str]:
    return [sys.executable, "-m", "tinyverse", *map(str, args)]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment")
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--match", action="append", default=[], metavar="NAME=GAMES")
    parser.add_argument("--run-flag", action="append", default=[], help="more flags of run, e.g. --players=2")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "games-2cores.jsonl"))
    parser.add_argument("--keep", help="a folder to keep the database in (default: a temp folder)")
    args = parser.parse_args()
    experiment = str(Path(args.experiment).resolve())
    sets = [a for s in args.set for a in ("--set", s)]
    folder = args.keep or tempfile.mkdtemp(prefix="tv-games-")
    Path(folder).mkdir(parents=True, exist_ok=True)
    db = ["--db", f"sqlite:///{folder}/run.db"]
    command = tinyverse(experiment, "run", "--eval-episodes", "0", *db, *sets, *args.run_flag)
    started = time.monotonic()
    with open(Path(folder) / "run.log", "a") as log:
        run = subprocess.Popen(command, cwd=folder, stdout=log, stderr=subprocess.STDOUT) if args.minutes else None
        try:
            run and run.wait(timeout=args.minutes * 60)
        except subprocess.TimeoutExpired:
            run.send_signal(signal.SIGINT)
            run.wait(timeout=180)
    trained = round((time.monotonic() - started) / 60, 2)
    print(f"run stopped after {trained} min; its log: {folder}/run.log", flush=True)
    row = {"experiment": Path(experiment).name, "sets": args.set, "minutes": trained, "run_flags": args.run_flag}
    row["matches"] = []
    for spec in args.match:
        opponent, _, games = spec.partition("=")
        flags = ["-n", games or "100", "--no-record", "--opponent", opponent]
        began = time.monotonic()
        out = subprocess.run(
            tinyverse(experiment, "eval", *flags, *db, *sets), cwd=folder, capture_output=True, text=True
        )
        found = MATCH.search(out.stdout)
        if found is None:
            print(f"eval against {opponent} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}", flush=True)
            row["matches"].append({"opponent": opponent, "error": out.stderr.strip().splitlines()[-1:]})
            continue
        print(found[0], f"({time.monotonic() - began:.0f} s)", flush=True)
        won, drawn, lost, n = (int(found[i]) for i in range(2, 6))
        version = re.search(r"\(params v(\d+)\)", out.stdout)
        match = {"opponent": opponent, "won": won, "drawn": drawn, "lost": lost, "games": n}
        match |= {"score": float(found[6]), "low": float(found[7]), "high": float(found[8])}
        match["version"] = int(version[1]) if version else None
        row["matches"].append(match)
    info = subprocess.run(tinyverse(experiment, "info", *db), cwd=folder, capture_output=True, text=True)
    ratings = [line.strip() for line in info.stdout.splitlines() if line.startswith(("  ratings", " " * 12))]
    print("\n".join(ratings))
    row["ratings"] = ratings
    row["date"] = time.strftime("%Y-%m-%d %H:%M")
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"row appended to {args.out}")


if __name__ == "__main__":
    main()
