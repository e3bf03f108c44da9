"""What examples/go.py learns in M minutes on this machine: a run with the defaults, then greedy evals against random
play (and optionally MCTS and GnuGo), each a win rate with its 95% Wilson interval.

    python bench/go.py                                   # 30 minutes of Go 9x9, then 200 games against random
    python bench/go.py --minutes 5 --set game=tic_tac_toe --games 50
    python bench/go.py --strong mcts:200 gnugo:1 --strong-games 20
    python bench/go.py --set tightening=true             # options of go.py for the run (an A/B: one run each)

(a) ``python -m tinyverse examples/go.py run --eval-episodes 0`` (one player, one trainer: the 2-core
machine's fleet) in a fresh temp dir on its own SQLite file, stopped with SIGTERM after ``--minutes`` (warm: the
trainer publishes), started and stopped by the clock, start-up included. (b) ``eval -n GAMES --no-record --set
opponent=random`` of the latest params: greedy, the agent's colour alternating game by game (GameEnv alternates
seats by episode), wins, draws and losses read from the returns eval prints (+1, 0, -1). (c) the same against
each ``--strong`` opponent for ``--strong-games`` games. The eval's ``--set opponent`` is tunable, so it is
stored as a tune of the (stopped) run: the prefix is thrown away after. One line a bench goes to ``--out``
(bench/results/go-2cores.txt) and to stdout: date, commit, options, moves played, updates, params version,
and each opponent's W/D/L with the win rate's interval.
"""

import argparse
import datetime
import math
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tinyverse.database import connect

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "go.py"
EPISODE = re.compile(r"^episode \d+/\d+: return (\S+), length \d+", re.M)


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion of ``successes`` in ``n``."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return centre - half, centre + half


def tinyverse(*args, cwd: str, timeout: float | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "tinyverse", str(EXAMPLE), *args]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def train(minutes: float, db: str, sets: list[str], cwd: str) -> None:
    """The run, stopped warmly after ``minutes``; its last lines shown."""
    command = [sys.executable, "-m", "tinyverse", str(EXAMPLE), "run", "--eval-episodes", "0", "--db", db, *sets]
    log = Path(cwd) / "run.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=minutes * 60)
            print(f"run exited by itself (code {proc.returncode}) before {minutes:g} minutes", flush=True)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=120)
    print("\n".join("  run: " + line for line in log.read_text().splitlines()[-4:]), flush=True)


def play(opponent: str, games: int, db: str, cwd: str) -> dict:
    """Wins, draws and losses of ``games`` greedy games of the latest params against ``opponent``."""
    found = tinyverse("eval", "-n", str(games), "--no-record", "--db", db, "--set", f"opponent={opponent}", cwd=cwd)
    if found.returncode != 0:
        raise SystemExit(f"eval against {opponent} failed:\n{found.stderr[-2000:]}")
    returns = [float(r) for r in EPISODE.findall(found.stdout)]
    return {"wins": sum(r > 0 for r in returns), "draws": sum(r == 0 for r in returns), "games": len(returns)}


def said(opponent: str, result: dict) -> str:
    wins, draws, n = result["wins"], result["draws"], result["games"]
    low, high = wilson(wins, n)
    rate = f"{wins / max(n, 1):.1%} won, 95% CI {low:.1%}-{high:.1%}"
    return f"vs {opponent} {wins}/{draws}/{n - wins - draws} W/D/L of {n} ({rate})"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=30.0, help="the run's wall time (30)")
    parser.add_argument("--games", type=int, default=200, help="games against random play (200)")
    parser.add_argument("--strong", nargs="*", default=[], help="more opponents, e.g. mcts:200 gnugo:1")
    parser.add_argument("--strong-games", type=int, default=20, help="games against each of them (20)")
    parser.add_argument("--set", action="append", default=[], metavar="NAME=VALUE", help="an option of go.py")
    parser.add_argument("--out", default=str(ROOT / "bench" / "results" / "go-2cores.txt"))
    args = parser.parse_args()
    sets = [a for option in args.set for a in ("--set", option)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    started = datetime.datetime.now().strftime("%Y-%m-%d %H:%M")
    with tempfile.TemporaryDirectory(prefix="tv-go-") as tmp:
        db = f"sqlite:///{tmp}/go.db"
        began = time.monotonic()
        train(args.minutes, db, sets, tmp)
        trained = time.monotonic() - began
        store = connect(db, "go", retry_for=5)
        options = store.setting("options") or {}
        moves = store.env_steps(options.get("session_length", 16))
        updates = store.counter("updates")
        version = store.params_version()
        store.close()
        results = {"random": play("random", args.games, db, tmp)}
        for opponent in args.strong:
            results[opponent] = play(opponent, args.strong_games, db, tmp)
    run = f"{started} {commit.stdout.strip() or '?'} {' '.join(args.set) or 'defaults'}"
    done = f"{trained / 60:.1f} min: {moves:,} moves, {updates:,} updates, params v{version}"
    line = f"{run}; {done}; " + "; ".join(said(name, result) for name, result in results.items())
    print(line, flush=True)
    with open(args.out, "a") as out:
        out.write(line + "\n")


if __name__ == "__main__":
    main()
