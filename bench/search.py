"""The cost of examples/alphazero.py's search: positions the net evaluates a second a core, alone (B=1) and with the
leaves of B games in one forward pass, and where a move's time goes, on Go 9x9 and Connect Four.

    python bench/search.py                                   # Go 9x9 and Connect Four, B = 1 and 16, 16 simulations
    python bench/search.py --games connect_four --batches 1,4,16,64 --simulations 8 --set channels=64

One process, one torch thread: a core. The same B mid-game positions (random play) are searched once a round:
B=1 searches them one after the other, B searches them together. Parts of the time: the net's forward passes
(``evaluate``, with its NumPy/torch conversions), the game (roots rebuilt from the observations' moves; states
cloned and a move applied for each new leaf; each leaf's observation: planes and legal moves), and the rest:
the tree's own work in Python (selection, sigma(q), backups). Absolute rates move with the machine's load:
compare rows of one run.
"""

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import alphazero  # noqa: E402
import games  # noqa: E402

from tinyverse.loader import parse_set, typed  # noqa: E402


class Clock:
    """Seconds spent in each wrapped function."""

    def __init__(self):
        self.seconds = {}

    def wrap(self, name: str, function):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start

        return timed


def positions(game: str, count: int, seed: int) -> list[dict]:
    """``count`` observations of the mover after random play of varied lengths (games still going)."""
    env = games.GameEnv(game, opponent="random", seed=seed)
    rng = np.random.default_rng(seed)
    found = []
    while len(found) < count:
        obs, _ = env.reset()
        for _ in range(rng.integers(2, 25)):
            obs, _, done, _, _ = env.step(int(rng.choice(np.flatnonzero(obs["action_mask"]))))
            if done:
                break
        if not done:
            found.append({k: np.asarray(v)[None] for k, v in obs.items()})
    return found


def measure(exp, observations: list[dict], batch: int, rounds: int) -> dict:
    """Search the positions ``rounds`` times, ``batch`` at a time: the seconds of each part, the evaluations."""
    clock = Clock()
    search = exp.search
    evaluated = [0]

    def evaluate(boards, masks):
        evaluated[0] += len(boards)
        return exp.evaluate(boards, masks)

    search.evaluate = clock.wrap("net forward", evaluate)
    search.new_child = clock.wrap("clone + apply", type(search).new_child.__get__(search))
    search.observe = clock.wrap("leaf observation", games.Observer(exp.game))
    games.replay = clock.wrap("root replay", REPLAY)
    groups = [observations[i : i + batch] for i in range(0, len(observations), batch)]
    stacked = [{k: np.concatenate([o[k] for o in group]) for k in group[0]} for group in groups]
    start = time.perf_counter()
    for _ in range(rounds):
        for obs in stacked:
            exp.act(obs, {})
    total = time.perf_counter() - start
    games.replay = REPLAY
    return {"total": total, "evaluated": evaluated[0], "moves": rounds * len(observations), **clock.seconds}


REPLAY = games.replay


def report(game: str, batch: int, found: dict, baseline: float | None) -> None:
    rate = found["evaluated"] / found["total"]
    parts = ["net forward", "clone + apply", "leaf observation", "root replay"]
    shares = {part: found.get(part, 0.0) / found["total"] for part in parts}
    shares["tree (the rest)"] = 1 - sum(shares.values())
    ratio = f"{rate / baseline:5.2f}x" if baseline else "    -"
    per_move = 1000 * found["total"] / found["moves"]
    said = f"{game:13} B={batch:<3} {rate:8.0f} positions/s/core {ratio} {per_move:7.1f} ms a move   "
    print(said + "  ".join(f"{k} {v:4.0%}" for k, v in shares.items()), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", default="go,connect_four", help="comma-separated OpenSpiel games")
    parser.add_argument("--batches", default="1,16", help="games searched at once (the first is the baseline)")
    parser.add_argument("--simulations", type=int, default=16, help="simulations a move")
    parser.add_argument("--positions", type=int, default=32, help="positions searched a round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds over the positions")
    parser.add_argument("--set", action="append", type=parse_set, default=[], help="an alphazero.Args NAME=VALUE")
    args = parser.parse_args()
    for game in args.games.split(","):
        sets = typed(alphazero.Args, "alphazero.py", dict(args.set))
        options = alphazero.Args(**{"game": game, "simulations": args.simulations, **sets})
        exp = alphazero.make_experiment(options)
        observations = positions(game, args.positions, seed=0)
        baseline = None
        for batch in (int(b) for b in args.batches.split(",")):
            exp.act(observations[0], {})  # warm-up
            found = measure(exp, observations, batch, args.rounds)
            report(game, batch, found, baseline)
            baseline = baseline or found["evaluated"] / found["total"]


if __name__ == "__main__":
    main()
