"""The runner: ``python -m tinyverse [EXPERIMENT.py] MODE [options]``.

Each mode is one small function; its docstring is its --help. The CLI only
parses arguments, opens the database and the experiment, and turns errors
into one line and a non-zero exit.
"""

import argparse
import logging
import os
import sqlite3
import sys
import time
from pathlib import Path
from urllib.parse import quote

import redis

from . import __version__, raycluster
from .database import DEFAULT_URL, connect, masked
from .errors import TinyverseError
from .evaluation import evaluate
from .experiment import load_experiment
from .launcher import run_fleet, spawn_local
from .monitor import info_text, plot
from .ops import export
from .player import play
from .trainer import train
from .workers import stop_workers


def mode_play(args):
    """Play B environments and record sessions into the database (runs until stopped)."""
    exp = _exp(args, db := _db(args))
    play(exp, db, args.batch_size or exp.play_batch_size, args.rounds, args.sync_every, args.buffer_size, args.seed)


def mode_train(args):
    """Train on sessions sampled from the database and publish params (runs until stopped)."""
    exp = _exp(args, db := _db(args))
    b, push = args.batch_size or exp.train_batch_size, (args.push_coef, args.sync, args.push_only.split(","))
    train(exp, db, b, args.updates, args.save_every or exp.save_every, args.buffer_size, 2.0, args.logdir, *push)


def mode_run(args):
    """Start players and trainers on this machine (or a Ray cluster), supervise them, stop them, then eval."""
    exp = _exp(args, db := _db(args))  # the children adopt the options it stores
    base, spawn = [sys.executable, "-m", "tinyverse", args.experiment], spawn_local
    if args.ray:  # workers run in the experiment's folder as Ray ships it: a SQLite path must not be relative
        args.db = f"sqlite:///{Path(db.path).resolve()}" if args.db.startswith("sqlite:") else args.db
        spawn = raycluster.join(args.ray, args.experiment, args.db, args.players + args.trainers)
        base = [Path(args.experiment).name]
    os.environ["TINYVERSE_DB"] = args.db  # children read it there: a password stays out of `ps`
    common = ["--prefix", db.prefix, "-q"] + (["--buffer-size", str(args.buffer_size)] if args.buffer_size else [])
    play_args = ["-b", str(args.batch_size or exp.play_batch_size), *common]
    train_args = ["-b", str(args.train_batch or exp.train_batch_size), "--push-coef", str(args.push_coef), *common]
    train_args += [] if args.sync is None else ["--sync" if args.sync else "--no-sync"]
    fleet = (args.players, args.trainers, play_args, train_args, args.steps, args.target_return, args.max_crashes)
    print(f"run stopped: {run_fleet(exp, db, base, *fleet, spawn=spawn)}")
    if args.eval_episodes:
        evaluate(exp, db, args.eval_episodes, None)


def mode_eval(args):
    """Play N full episodes with the latest params (or a file's) and print each return and mean ± std."""
    record = None if args.no_record else args.record
    if args.params:  # no database: the file holds the params and the options
        exp, meta, _ = export.load(args.params, args.experiment, dict(args.options))
        evaluate(exp, None, args.episodes, record, args.seed, version=int(meta["version"]))
    else:
        db = _db(args, retry_for=30, create=False)
        evaluate(_exp(args, db), db, args.episodes, record, args.seed)


def mode_export(args):
    """Write the latest params, with the run's options, to a safetensors file (loads without tinyverse)."""
    path = args.output or f"{Path(args.experiment).stem}.safetensors"
    version = export.export(_db(args, retry_for=30, create=False), args.experiment, path)
    print(f"wrote {path}: params version {version} of prefix {args.prefix}")


def mode_import(args):
    """Seed the namespace with the params and options of a file written by export (a warm start, or a move)."""
    version = export.import_into(_db(args, retry_for=30), args.file, args.experiment, dict(args.options))
    print(f"imported {args.file} into prefix {args.prefix} of {masked(args.db)}: params version {version}")


def mode_clear(args):
    """Stop workers and/or delete sessions, params and metrics (--all: everything)."""
    picked = [args.del_sessions, args.del_weights, args.del_metrics, args.kill_players, args.kill_trainers]
    if not (args.all or any(picked)):
        raise TinyverseError("say what to clear: --all, --del-{sessions,weights,metrics} or --kill-{players,trainers}")
    dbs = _namespaces(args)
    if not dbs:
        print(f"nothing to clear: no experiments in {masked(args.db)}")
    for db in dbs:
        roles = {r for r, on in (("player", args.kill_players), ("trainer", args.kill_trainers)) if on or args.all}
        for line in stop_workers(db, roles):
            print(f"{db.prefix}: {line}")
        what = dict(sessions=args.del_sessions, params=args.del_weights, metrics=args.del_metrics)
        what = {k: v or args.all for k, v in what.items()}
        db.clear(**what, workers=args.all)
        print(f"{db.prefix}: cleared {', '.join(k for k, v in what.items() if v) or 'no data'}")


def mode_info(args):
    """Dashboard: sessions, params and their age, the pace, live workers with their lag, returns, training."""
    while True:
        dbs = _namespaces(args)
        text = "\n".join(info_text(db, args.last) for db in dbs) or f"no experiments in {masked(args.db)}"
        if not args.watch:
            print(text)
            return
        print("\033[H\033[J" + text + f"\n\n(every {args.watch:g}s; Ctrl-C to quit)", flush=True)
        time.sleep(args.watch)


def mode_plot(args):
    """Draw learning curves (return vs env steps and wall time, trainer loss) into a PNG."""
    plot(_db(args, retry_for=5, create=False), args.output)
    print(f"wrote {args.output}")


MODES = {"play": mode_play, "train": mode_train, "run": mode_run, "eval": mode_eval}
MODES |= {"clear": mode_clear, "info": mode_info, "plot": mode_plot, "export": mode_export, "import": mode_import}
NEEDS_EXPERIMENT = {"play", "train", "run", "eval", "export", "import"}


def _db(args, retry_for=None, create=True):
    return connect(args.db, args.prefix, retry_for=retry_for, create=create)


def _exp(args, db):
    return load_experiment(args.experiment, db, dict(args.options))  # stores the run's options if new


def _namespaces(args):
    """The experiment's namespace, or every namespace when no experiment or prefix is named."""
    db = _db(args, retry_for=5, create=False)
    if args.experiment or args.prefix_given:
        return [db]
    found = [connect(args.db, p, retry_for=5) for p in db.namespaces()]
    return [d for d in found if d.count_sessions()[1] or d.params_version() is not None or d.workers()]


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, like every other tinyverse error."""

    def error(self, message):
        raise TinyverseError(f"{message} (see python -m tinyverse --help)")


def _count(least: int):
    def count(text: str) -> int:
        if not text.strip().lstrip("-").isdigit() or int(text) < least:
            raise argparse.ArgumentTypeError(f"want a whole number of at least {least}, got {text!r}")
        return int(text)

    return count


def _option(text: str) -> tuple[str, str]:
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"want NAME=VALUE, got {text!r}")
    name, value = text.split("=", 1)
    return name.strip(), value


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("database")
    g.add_argument(
        "--db", help="sqlite:///file.db (default, $TINYVERSE_DB), redis://[user:password@]host:port/0, rediss://"
    )
    g.add_argument("--host", help="Redis host: shorthand for --db redis://HOST:PORT/0")
    g.add_argument("--port", type=int, help="Redis port (default 6379)")
    g.add_argument("--password", help="Redis password")
    g.add_argument("--tls-ca", metavar="FILE", help="TLS to Redis: the CA certificate that signed the server's")
    g.add_argument("--prefix", "--key-prefix", help="namespace in the database (default: the experiment's name)")
    common.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    common.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    experiment = argparse.ArgumentParser(add_help=False)
    g = experiment.add_argument_group("experiment")
    g.add_argument("--set", dest="options", metavar="NAME=VALUE", type=_option, action="append", default=[],
                   help="an option of the experiment; the first worker stores them, later ones adopt them")  # fmt: skip
    g.add_argument("--device", help="sets $TINYVERSE_DEVICE for the experiment (auto, cpu, cuda, cuda:1, ...)")

    parser = _Parser(
        prog="python -m tinyverse",
        usage="python -m tinyverse [EXPERIMENT.py] MODE [options]",
        description="tinyverse: players record sessions, trainers learn from them, all through one database.",
        epilog="example: python -m tinyverse examples/cartpole_dqn.py play -b 4",
    )
    parser.add_argument("--version", action="version", version=f"tinyverse {__version__}")
    sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    p = {}
    for name, fn in MODES.items():
        doc, needs = fn.__doc__.strip(), name in NEEDS_EXPERIMENT
        prog = f"python -m tinyverse {'EXPERIMENT.py' if needs else '[EXPERIMENT.py]'} {name}"
        parents = [common, experiment] if needs else [common]
        p[name] = sub.add_parser(name, parents=parents, help=doc, description=doc, prog=prog)
    one, zero = _count(1), _count(0)
    p["play"].add_argument("-b", "--batch-size", type=one, help="environments played at once (default: experiment's)")
    p["play"].add_argument("-n", "--rounds", type=one, help="rounds (one session per environment each), then exit")
    p["play"].add_argument("-s", "--sync-every", type=one, default=1, help="check for new params every S rounds")
    p["play"].add_argument("--seed", type=int, help="seed of the environments")
    p["train"].add_argument("-b", "--batch-size", type=one, help="sessions per minibatch (default: experiment's)")
    p["train"].add_argument("-n", "--updates", type=one, help="updates to run, then exit")
    p["train"].add_argument("-s", "--save-every", type=one, help="publish params every S updates (default 100)")
    p["train"].add_argument("--logdir", help="also write TensorBoard event files here")
    p["run"].add_argument("--players", type=one, default=1, help="player processes (default 1)")
    p["run"].add_argument("-b", "--batch-size", type=one, help="environments per player (default: experiment's)")
    p["run"].add_argument("--trainers", type=one, default=1, help="trainer processes (default 1)")
    p["run"].add_argument("--train-batch", type=one, help="sessions per minibatch (default: experiment's)")
    p["run"].add_argument("-n", "--steps", type=one, help="stop after this many env steps (all players together)")
    p["run"].add_argument("--target-return", type=float, help="stop once the mean of 20 recent returns reaches it")
    p["run"].add_argument("--max-crashes", type=one, default=5, help="crashes of one worker in 2 min that end the run")
    ray = "run the workers as Ray tasks spread over the nodes of the Ray cluster at ADDRESS (auto, HOST:PORT)"
    p["run"].add_argument("--ray", metavar="ADDRESS", help=ray)
    p["run"].add_argument("--eval-episodes", type=zero, default=10, help="episodes of the final eval (0: none)")
    for name in ("play", "train", "run"):
        p[name].add_argument("--buffer-size", type=one, help="sessions the database keeps, for every worker")
    for name in ("train", "run"):  # several trainers: a parameter server (tinyverse.params.Publisher)
        p[name].add_argument("--push-coef", type=float, default=1.0, help="push coef x own delta (default 1)")
        sync = "take the merged params after each push (default: once another trainer pushed)"
        p[name].add_argument("--sync", action=argparse.BooleanOptionalAction, help=sync)
    p["train"].add_argument("--push-only", default="", help="comma-separated globs of the arrays to push (all)")
    p["eval"].add_argument("-n", "--episodes", type=one, default=10, help="full episodes to play")
    p["eval"].add_argument("--record", default="records", help="directory for mp4 videos (default ./records)")
    p["eval"].add_argument("--no-record", action="store_true", help="no video")
    p["eval"].add_argument("--seed", type=int, help="seed of the first episode")
    p["eval"].add_argument("--params", metavar="FILE", help="play the params of this file (from export), no database")
    p["export"].add_argument("-o", "--output", help="file to write (default EXPERIMENT.safetensors)")
    p["import"].add_argument("file", help="a .safetensors file written by export")
    p["info"].add_argument("--watch", nargs="?", type=float, const=2.0, help="refresh every N seconds (default 2)")
    p["info"].add_argument("--last", type=one, default=100, help="episodes in the returns summary")
    p["plot"].add_argument("-o", "--output", default="curve.png", help="PNG file to write (default curve.png)")
    for flag, what in [("--all", "all of the below"), ("--del-sessions", "delete recorded sessions")]:
        p["clear"].add_argument(flag, action="store_true", help=what)
    p["clear"].add_argument("--del-weights", "--del-params", action="store_true", help="delete params")
    p["clear"].add_argument("--del-metrics", action="store_true", help="delete returns and trainer metrics")
    for role in ("players", "trainers"):
        stop = f"stop this machine's {role}, and ask those on other machines to stop"
        p["clear"].add_argument(f"--kill-{role}", action="store_true", help=stop)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    experiment = None
    if argv and argv[0] not in MODES and not argv[0].startswith("-"):
        experiment, argv = argv[0], argv[1:]
    args = build_parser().parse_args(argv)
    args.experiment = experiment
    if args.mode in NEEDS_EXPERIMENT and experiment is None:
        raise TinyverseError(f"{args.mode} needs an experiment: python -m tinyverse EXPERIMENT.py {args.mode}")
    args.prefix_given = args.prefix is not None
    if args.prefix is None:
        args.prefix = Path(experiment).stem if experiment else "tinyverse"
    if args.host or args.port or args.password:
        auth = f":{quote(args.password, safe='')}@" if args.password else ""
        args.db = f"redis://{auth}{args.host or 'localhost'}:{args.port or 6379}/0"
    args.db = args.db or os.environ.get("TINYVERSE_DB") or DEFAULT_URL
    if args.tls_ca:  # TLS: rediss://, and redis-py reads the CA from the URL's query
        path = Path(args.tls_ca).resolve()
        if not path.is_file() or not args.db.startswith(("redis://", "rediss://")):
            raise TinyverseError(f"--tls-ca {args.tls_ca}: want the CA certificate file (PEM) of a Redis server")
        args.db = "rediss://" + args.db.split("://", 1)[1] + ("&" if "?" in args.db else "?")
        args.db += f"ssl_ca_certs={quote(str(path))}"
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse(argv)
        level = logging.WARNING if args.quiet else logging.DEBUG if args.verbose > 1 else logging.INFO
        logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s: %(message)s", datefmt="%H:%M:%S")
        if getattr(args, "device", None):  # experiments read it; run's children inherit it
            os.environ["TINYVERSE_DEVICE"] = args.device
        MODES[args.mode](args)
        return 0
    except TinyverseError as e:
        print(f"tinyverse: error: {e}", file=sys.stderr)
    except redis.RedisError as e:
        print(f"tinyverse: error: Redis: {e} (check --db, --password, and that redis-server runs)", file=sys.stderr)
    except sqlite3.Error as e:
        print(f"tinyverse: error: SQLite: {e} (check the --db path)", file=sys.stderr)
    except KeyboardInterrupt:
        print("tinyverse: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os._exit(0)
    return 1
