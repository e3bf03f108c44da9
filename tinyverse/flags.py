"""The flags of each mode and what each takes: whole numbers within caps, seconds, ports, files to
write. A value out of bounds is argparse's one line naming the flag, before anything runs."""

import argparse
import math
import os
import re
from pathlib import Path

from .league import NAME_RE

# caps past which a size is a slip of the keyboard that would never answer (a billion envs built)
MAX_ENVS = 10_000  # environments one player steps at once: for more, start more players
MAX_BATCH = 1_000_000  # sessions a minibatch: the most a buffer keeps by default
MAX_BUFFER = 10_000_000  # sessions a database keeps: 10 GB of Redis memory at a small 1 kB each
MAX_PROCESSES = 1_000  # players or trainers one run starts
MAX_COUNT = 10**18  # any other count: SQLite and Redis store integers below 2^63


def count(text: str, least: int = 1, most: int = MAX_COUNT, why: str = "") -> int:
    """A whole number from ``least`` to ``most`` (``why``: the cap's reason, said when passed)."""
    if not re.fullmatch(r"-?[0-9]+", text.strip()) or int(text) < least:
        raise argparse.ArgumentTypeError(f"want a whole number of at least {least}, got {text!r}")
    if int(text) > most:
        raise argparse.ArgumentTypeError(f"want at most {most:,}{why}, got {text!r}")
    return int(text)


def within(least: int = 1, most: int = MAX_COUNT, why: str = "") -> dict:
    """add_argument's keywords of a count."""
    return {"type": lambda text: count(text, least, most, why)}


def number(text: str) -> float:
    """A finite number (``nan`` or ``inf`` would never be reached)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"want a finite number, got {text!r}")
    return value


def seconds(text: str) -> float:
    """Seconds between two looks: from 0.1 (less is a busy loop on the database) to a day."""
    if not 0.1 <= (value := number(text)) <= 86400:
        raise argparse.ArgumentTypeError(f"want seconds from 0.1 to 86400, got {text!r}")
    return value


def opponent(text: str) -> str:
    """A game's opponent as an experiment names it: random, mcts:200, gnugo:1, v120, ..."""
    if not NAME_RE.fullmatch(text):
        raise argparse.ArgumentTypeError(
            f"want a name such as random, mcts:200 or v120, got {text!r:.70}"
        )
    return text


def output(text: str) -> str:
    """A file to write: in a folder that exists and takes files, and no folder itself."""
    path = Path(text)
    if not text or path.is_dir():
        raise argparse.ArgumentTypeError(f"{text or '.'!r} is a folder: name a file in it")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"no folder {path.parent} for {text}: create it first")
    taken = path.exists() and not os.access(path, os.W_OK)
    if taken or not os.access(path.parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write {text}: no permission; pick another path")
    return text


ONE = within(1)
ZERO = within(0)
ON = {"action": "store_true"}  # a switch: --x
BOTH = {"action": argparse.BooleanOptionalAction}  # a switch: --x or --no-x
ENVS = within(1, MAX_ENVS, " environments a player (start more players)")
BATCH = within(1, MAX_BATCH, " sessions a minibatch (the most a buffer keeps by default)")
PROCESSES = within(1, MAX_PROCESSES, " processes a run")
BUFFER_SIZE = within(1, MAX_BUFFER, " sessions (10 GB of Redis memory at 1 kB each)")
BUFFER = ("--buffer-size", BUFFER_SIZE, "sessions the database keeps, for every worker")
SYNC = ("--sync", BOTH, "take the merged params after each push (default: once another pushed)")
SEED = within(0, 2**63 - 1)
# mode -> (flags, add_argument's keywords, help): beside the database and experiment groups
FLAGS = {
    "play": [
        ("-b --batch-size", ENVS, "environments played at once (default: experiment's)"),
        ("-n --rounds", ONE, "rounds (one session per environment each), then exit"),
        ("-s --sync-every", ONE | {"default": 1}, "check for new params every S rounds"),
        ("--seed", SEED, "seed of the environments"),
        BUFFER,
    ],
    "train": [
        ("-b --batch-size", BATCH, "sessions per minibatch (default: experiment's)"),
        ("-n --updates", ONE, "updates to run, then exit"),
        ("-s --save-every", ONE, "publish params every S updates (default 100)"),
        ("--logdir", {}, "also write TensorBoard event files here"),
        BUFFER,
        SYNC,
    ],
    "run": [
        ("--players", PROCESSES | {"default": 1}, "player processes (default 1)"),
        ("-b --batch-size", ENVS, "environments per player (default: experiment's)"),
        ("--trainers", PROCESSES | {"default": 1}, "trainer processes (default 1)"),
        ("--train-batch", BATCH, "sessions per minibatch (default: experiment's)"),
        ("-n --steps", ONE, "stop after this many env steps (all players together)"),
        ("--target-return", {"type": number}, "stop once the mean of 20 recent returns reaches it"),
        ("--target-eval", ONE, "hold --target-return against N greedy episodes every 30 s instead"),
        ("--target-passes", ONE, "greedy evals in a row that must reach it (default 2)"),
        ("--max-crashes", ONE | {"default": 5}, "crashes of one worker in 2 min that end the run"),
        ("--ray", {"metavar": "ADDRESS"}, "workers as Ray tasks at ADDRESS (auto, HOST:PORT)"),
        ("--eval-episodes", ZERO | {"default": 10}, "episodes of the final eval (0: none)"),
        BUFFER,
        SYNC,
    ],
    "eval": [
        ("-n --episodes", ONE | {"default": 10}, "full episodes to play"),
        ("--record", {"default": "records"}, "directory for mp4 videos (default ./records)"),
        ("--no-record", ON, "no video"),
        ("--seed", SEED, "seed of the first episode"),
        ("--params", {"metavar": "FILE|NAME"}, "export's file (no database), snapshot, vN, latest"),
        ("--opponent", {"type": opponent}, "a game's opponent (random, mcts:200, v120): rated"),
    ],
    "info": [
        ("--watch", {"type": seconds, "nargs": "?", "const": 2.0}, "refresh every N s (default 2)"),
        ("--last", ONE | {"default": 100}, "episodes in the returns summary"),
    ],
    "plot": [
        ("-o --output", {"type": output, "default": "curve.png"}, "image file (default curve.png)"),
    ],
    "clear": [
        ("--all", ON, "all of the below"),
        ("--del-sessions", ON, "delete recorded sessions"),
        ("--del-params --del-weights", ON | {"dest": "del_params"}, "delete params and snapshots"),
        ("--del-metrics", ON, "delete returns and trainer metrics"),
        ("--kill-players", ON, "stop this machine's players, and ask those elsewhere to stop"),
        ("--kill-trainers", ON, "stop this machine's trainers, and ask those elsewhere to stop"),
    ],
    "export": [
        ("-o --output", {"type": output}, "file to write (default EXPERIMENT.safetensors)"),
        ("--params", {"metavar": "NAME"}, "a snapshot, vN or latest (default: passed, or latest)"),
    ],
    "import": [("file", {}, "a .safetensors file written by export")],
}
