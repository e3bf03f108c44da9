"""A game's learning, judged by matches: ``run`` an experiment of games (examples/alphazero.py, examples/go.py) for
M minutes on a fresh SQLite file, then ``eval --opponent`` its greedy agent (the latest params) against fixed
opponents, colours alternated by the env, each match's score with its 95% interval; a row of JSON a run appends to
``--out``.

    python bench/games.py examples/alphazero.py --minutes 60 --set game=connect_four --match mcts:1000=100
    python bench/games.py examples/go.py --minutes 30 --match random=200 --match mcts:200=100

``--minutes 0 --keep FOLDER`` judges what an earlier run left in FOLDER. ``--match NAME=GAMES`` (repeatable) is
an opponent and the games against it. The run is ``python -m tinyverse EXP run --eval-episodes 0`` with the
example's defaults and the given ``--set``s; after M minutes the script sends it Ctrl-C (SIGINT: the workers stop,
the trainer publishes), so the agent judged is the one M minutes of training left. ``--sixths NAME`` prints the
games the players rated against NAME (alphazero.py's ``rated_opponent``) before the matches, in six parts by time.
``--snapshots NAME=GAMES`` plays every kept ``vN`` snapshot against NAME after the matches (``eval --params vN``),
each with its minute of the run: the agent's strength over the run, not only at its end; ``--spread K`` plays K
of them instead, the nearest to K evenly spaced minutes of the run, its end the last (a run keeps every
``keep_every``-th version, only the newest 50 of them: a 2-hour Go run's from minute 38 on).
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
    parser.add_argument("--sixths", metavar="NAME", help="print the run's rated games against NAME by sixths")
    parser.add_argument("--snapshots", metavar="NAME=GAMES", help="each kept vN snapshot's match against NAME")
    parser.add_argument("--spread", type=int, metavar="K", help="--snapshots of K snapshots spread over the run")
    args = parser.parse_args()
    if args.spread is not None and args.spread < 1:
        parser.error(f"--spread {args.spread}: give a number of snapshots, 1 or more, e.g. --spread 6")
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
    judged = time.time()  # games stored after this are the matches' own
    print(f"run stopped after {trained} min; its log: {folder}/run.log", flush=True)
    row = {"experiment": Path(experiment).name, "sets": args.set, "minutes": trained, "run_flags": args.run_flag}
    row["matches"] = []
    for spec in args.match:
        row["matches"].append(match(experiment, folder, db + sets, spec))
    if args.snapshots:
        row["snapshots"] = each_snapshot(experiment, folder, db + sets, args.snapshots, args.spread)
    info = subprocess.run(tinyverse(experiment, "info", *db), cwd=folder, capture_output=True, text=True)
    ratings = [line.strip() for line in info.stdout.splitlines() if line.startswith(("  ratings", " " * 12))]
    print("\n".join(ratings))
    row["ratings"] = ratings
    if args.sixths:
        print(sixths(run_db(folder, experiment), args.sixths, before=judged))
    row["date"] = time.strftime("%Y-%m-%d %H:%M")
    with open(args.out, "a") as f:
        f.write(json.dumps(row) + "\n")
    print(f"row appended to {args.out}")


def match(experiment: str, folder: str, flags: list[str], spec: str, params: str = "latest") -> dict:
    """``eval --opponent`` of the params named (latest, vN) against ``spec`` (NAME=GAMES): the row of a match."""
    opponent, _, games = spec.partition("=")
    flags = [*flags, "-n", games or "100", "--no-record", "--opponent", opponent, "--params", params]
    began = time.monotonic()
    out = subprocess.run(tinyverse(experiment, "eval", *flags), cwd=folder, capture_output=True, text=True)
    found = MATCH.search(out.stdout)
    if found is None:
        print(f"eval against {opponent} failed:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}", flush=True)
        return {"opponent": opponent, "error": out.stderr.strip().splitlines()[-1:]}
    print(found[0], f"({time.monotonic() - began:.0f} s)", flush=True)
    won, drawn, lost, n = (int(found[i]) for i in range(2, 6))
    version = re.search(r"\(params v(\d+)\)", out.stdout)
    row = {"opponent": opponent, "won": won, "drawn": drawn, "lost": lost, "games": n}
    row |= {"score": float(found[6]), "low": float(found[7]), "high": float(found[8])}
    row["version"] = int(version[1]) if version else None
    return row


def each_snapshot(experiment: str, folder: str, flags: list[str], spec: str, spread: int | None) -> list[dict]:
    """The match ``spec`` of every kept ``vN`` snapshot (or of ``spread`` of them, the nearest to evenly spaced
    minutes, the last included), oldest first, each with its minute of the run (from the trainer's first report, a
    few seconds after the run's start)."""
    db = run_db(folder, experiment)
    start = min(r["time"] for r in db.metrics("train"))
    kept = sorted((s for s in db.snapshots() if s.name == f"v{s.version}"), key=lambda s: s.version)
    db.close()
    if spread and len(kept) > spread:
        end = kept[-1].time
        wanted = [start + (end - start) * (k + 1) / spread for k in range(spread)]
        nearest = {min(kept, key=lambda s: abs(s.time - t)).version for t in wanted}
        kept = [s for s in kept if s.version in nearest]
    rows = []
    for snapshot in kept:
        minute = round((snapshot.time - start) / 60, 1)
        print(f"v{snapshot.version} (minute {minute}) ", end="", flush=True)
        rows.append(match(experiment, folder, flags, spec, snapshot.name) | {"minute": minute})
    return rows


def run_db(folder: str, experiment: str):
    """The run's database in ``folder``, in the experiment's namespace."""
    from tinyverse.database import connect

    return connect(f"sqlite:///{folder}/run.db", prefix=Path(experiment).stem, create=False)


def sixths(db, opponent: str, before: float) -> str:
    """The games stored against ``opponent`` before ``before`` (unix time), in six parts by time: each part's
    versions, minutes from the first game, wins, draws, losses and score."""
    rows = sorted(
        (r for r in db.metrics("games", 200_000) if r.get("opponent") == opponent and r["time"] < before),
        key=lambda r: r["time"],
    )
    if not rows:
        return f"no rated games against {opponent}"
    lines = [f"rated games against {opponent} during the run, in sixths by time ({len(rows)} games):"]
    for k in range(6):
        part = rows[k * len(rows) // 6 : (k + 1) * len(rows) // 6]
        if not part:
            continue
        scores = [r["score"] for r in part]
        versions = sorted(int(r["side"][1:]) for r in part)
        first = (part[0]["time"] - rows[0]["time"]) / 60
        last = (part[-1]["time"] - rows[0]["time"]) / 60
        counts = f"{scores.count(1.0)} won, {scores.count(0.5)} drawn, {scores.count(0.0)} lost of {len(scores)}"
        score = sum(scores) / len(scores)
        lines.append(f"  v{versions[0]}-v{versions[-1]} (minutes {first:.0f}-{last:.0f}): {counts}: score {score:.3f}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
