"""The runner: ``python -m tinyverse [EXPERIMENT.py] MODE [options]``.

Each mode is one small function; its docstring is its --help. The CLI only
parses arguments, opens the database and the experiment, and turns errors
into one line and a non-zero exit.
"""

import argparse
import logging
import os
import sys
import time
from pathlib import Path
from urllib.parse import quote

import numpy as np

from . import __version__, errors
from .database import DEFAULT_URL, connect, masked
from .errors import TinyverseError
from .evaluation import evaluate
from .experiment import import_file, load_experiment
from .options import describe, parse_set
from .player import play
from .trainer import train


def mode_play(args):
    """Play B environments and record sessions into the database (runs until stopped)."""
    exp = _exp(args, db := _db(args))
    play(exp, db, args.batch_size or exp.play_batch_size, args.rounds, args.sync_every, args.seed)


def mode_train(args):
    """Train on sessions sampled from the database and publish params (runs until stopped)."""
    exp = _exp(args, db := _db(args))
    events = None
    if args.logdir:
        from .ops.monitor import EventWriter

        events = EventWriter(args.logdir, db)
    try:
        b, every = args.batch_size or exp.train_batch_size, args.save_every or exp.save_every
        train(
            exp,
            db,
            b,
            args.updates,
            every,
            sync=args.sync,
            push_coef=args.push_coef,
            on_report=events and events.report,
        )
    finally:
        if events:
            events.close()


def mode_run(args):
    """Start players and trainers on this machine (or a Ray cluster), supervise them, stop them, then eval."""
    from .ops import launcher, ray

    exp = _exp(args, db := _db(args))
    experiment, spawn, url = args.experiment, launcher.spawn_local, args.url
    if args.ray:  # workers run in the experiment's folder as Ray ships it: a SQLite path must not be relative
        url = f"sqlite:///{Path(db.path).resolve()}" if url.startswith("sqlite:") else url
        spawn, experiment = ray.join(args.ray, experiment, url, args.players + args.trainers), Path(experiment).name
    os.environ["TINYVERSE_DB"] = url  # children read it there: a password stays out of `ps`
    b, tb = args.batch_size or exp.play_batch_size, args.train_batch or exp.train_batch_size
    workers = launcher.fleet(experiment, db.prefix, args.options, args.players, args.trainers, b, tb,
                             args.sync, args.push_coef)  # fmt: skip
    judge = (lambda: float(np.mean(evaluate(exp, db, args.target_eval, quiet=True)))) if args.target_eval else None
    reason = launcher.run_fleet(db, workers, exp.session_length, args.steps, args.target_return, args.max_crashes,
                                spawn, judge)  # fmt: skip
    print(f"run stopped: {reason}")
    if args.eval_episodes:
        evaluate(exp, db, args.eval_episodes, None)


def mode_eval(args):
    """Play N full episodes with the latest params (or a file's) and print each return and mean ± std."""
    from .ops import export

    record = None if args.no_record else args.record
    if args.params:  # no database: the file holds the params and the options
        exp, meta, _ = export.load(args.params, args.experiment, dict(args.options))
        evaluate(exp, None, args.episodes, record, args.seed, version=int(meta["version"]))
    else:
        db = _db(args, retry_for=30, create=False)
        evaluate(_exp(args, db), db, args.episodes, record, args.seed)


def mode_export(args):
    """Write the latest params, with the run's options, to a safetensors file (loads without tinyverse)."""
    from .ops import export

    path = args.output or f"{Path(args.experiment).stem}.safetensors"
    version = export.export(_db(args, retry_for=30, create=False), args.experiment, path)
    print(f"wrote {path}: params version {version} of prefix {args.prefix}")


def mode_import(args):
    """Seed the namespace with the params and options of a file written by export (a warm start, or a move)."""
    from .ops import export

    version = export.import_into(_db(args, retry_for=30), args.file, args.experiment, dict(args.options))
    print(f"imported {args.file} into prefix {args.prefix} of {masked(args.url)}: params version {version}")


def mode_clear(args):
    """Stop workers and/or delete sessions, params and metrics (--all: everything)."""
    from .ops.stop import stop_workers

    picked = [args.del_sessions, args.del_weights, args.del_metrics, args.kill_players, args.kill_trainers]
    if not (args.all or any(picked)):
        raise TinyverseError("say what to clear: --all, --del-{sessions,weights,metrics} or --kill-{players,trainers}")
    if not (dbs := _namespaces(args)):
        print(f"nothing to clear: no experiments in {masked(args.url)}")
    for db in dbs:
        roles = {r for r, on in (("player", args.kill_players), ("trainer", args.kill_trainers)) if on or args.all}
        for line in stop_workers(db, roles):
            print(f"{db.prefix}: {line}")
        what = dict(sessions=args.del_sessions, params=args.del_weights, metrics=args.del_metrics)
        what = {k: v or args.all for k, v in what.items()}
        db.clear(**what, workers=args.all)
        print(f"{db.prefix}: cleared {', '.join(k for k, v in what.items() if v) or 'no data'}")


def mode_info(args):
    """Dashboard: sessions, options, params and their age, the pace, live workers with their lag, returns, training."""
    from .ops.monitor import info_text

    listed = ["  option    " + line for line in _options(args)] if args.experiment else []
    while True:
        text = (
            "\n".join(info_text(db, args.last) for db in _namespaces(args)) or f"no experiments in {masked(args.url)}"
        )
        text += "".join("\n" + line for line in listed)
        if not args.watch:
            print(text)
            return
        print("\033[H\033[J" + text + f"\n\n(every {args.watch:g}s; Ctrl-C to quit)", flush=True)
        time.sleep(args.watch)


def mode_plot(args):
    """Draw learning curves (return vs env steps and wall time, trainer loss) into a PNG."""
    from .ops.monitor import plot

    plot(_db(args, retry_for=5, create=False), args.output)
    print(f"wrote {args.output}")


MODES = {"play": mode_play, "train": mode_train, "run": mode_run, "eval": mode_eval, "clear": mode_clear}
MODES |= {"info": mode_info, "plot": mode_plot, "export": mode_export, "import": mode_import}
NEEDS_EXPERIMENT = {"play", "train", "run", "eval", "export", "import"}


def _db(args, retry_for=None, create=True):
    db = connect(args.url, args.prefix, retry_for=retry_for, create=create)
    if getattr(args, "buffer_size", None):
        db.set_capacity(args.buffer_size)
    return db


def _exp(args, db):
    return load_experiment(args.experiment, db, dict(args.options))


def _namespaces(args):
    """The experiment's namespace, or every namespace when no experiment or prefix is named."""
    db = _db(args, retry_for=5, create=False)
    if args.experiment or args.prefix_given:
        return [db]
    found = [connect(args.url, p, retry_for=5) for p in db.namespaces()]
    return [d for d in found if d.count_sessions().added or d.params_version() is not None or d.workers()]


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


ONE, ZERO, ON = _count(1), _count(0), "store_true"
# mode -> (flags, type or action, default, help): every flag but the database and experiment groups
FLAGS = {
    "play": [("-b --batch-size", ONE, None, "environments played at once (default: experiment's)"),
             ("-n --rounds", ONE, None, "rounds (one session per environment each), then exit"),
             ("-s --sync-every", ONE, 1, "check for new params every S rounds"),
             ("--seed", int, None, "seed of the environments")],
    "train": [("-b --batch-size", ONE, None, "sessions per minibatch (default: experiment's)"),
              ("-n --updates", ONE, None, "updates to run, then exit"),
              ("-s --save-every", ONE, None, "publish params every S updates (default 100)"),
              ("--logdir", str, None, "also write TensorBoard event files here")],
    "run": [("--players", ONE, 1, "player processes (default 1)"),
            ("-b --batch-size", ONE, None, "environments per player (default: experiment's)"),
            ("--trainers", ONE, 1, "trainer processes (default 1)"),
            ("--train-batch", ONE, None, "sessions per minibatch (default: experiment's)"),
            ("-n --steps", ONE, None, "stop after this many env steps (all players together)"),
            ("--target-return", float, None, "stop once the mean of 20 recent returns reaches it"),
            ("--target-eval", ONE, None, "hold --target-return against N greedy episodes every 30 s instead"),
            ("--max-crashes", ONE, 5, "crashes of one worker in 2 min that end the run"),
            ("--ray", "ADDRESS", None, "workers as Ray tasks over the Ray cluster at ADDRESS (auto, HOST:PORT)"),
            ("--eval-episodes", ZERO, 10, "episodes of the final eval (0: none)")],
    "eval": [("-n --episodes", ONE, 10, "full episodes to play"),
             ("--record", str, "records", "directory for mp4 videos (default ./records)"),
             ("--no-record", ON, False, "no video"),
             ("--seed", int, None, "seed of the first episode"),
             ("--params", "FILE", None, "play the params of this file (from export), no database")],
    "info": [("--watch", float, None, "refresh every N seconds (default 2)"),
             ("--last", ONE, 100, "episodes in the returns summary")],
    "plot": [("-o --output", str, "curve.png", "PNG file to write (default curve.png)")],
    "clear": [("--all", ON, False, "all of the below"), ("--del-sessions", ON, False, "delete recorded sessions"),
              ("--del-weights --del-params", ON, False, "delete params"),
              ("--del-metrics", ON, False, "delete returns and trainer metrics"),
              ("--kill-players", ON, False, "stop this machine's players, and ask those on other machines to stop"),
              ("--kill-trainers", ON, False, "stop this machine's trainers, and ask those on other machines to stop")],
    "export": [("-o --output", str, None, "file to write (default EXPERIMENT.safetensors)")],
    "import": [("file", str, None, "a .safetensors file written by export")],
}  # fmt: skip
for _mode in ("play", "train", "run"):
    FLAGS[_mode].append(("--buffer-size", ONE, None, "sessions the database keeps, for every worker"))
for _mode in ("train", "run"):  # several trainers: a parameter server (tinyverse.params.Publisher)
    sync = "take the merged params after each push (default: once another trainer pushed)"
    FLAGS[_mode].append(("--sync", argparse.BooleanOptionalAction, None, sync))
    FLAGS[_mode].append(("--push-coef", float, 1.0, "push coef x own delta (default 1)"))


def _add(parser: argparse.ArgumentParser, flags: str, kind, default, text: str) -> None:
    """One row of FLAGS: a type (or "METAVAR": a string), an action, or a flag of --watch's optional value."""
    if kind == ON or kind is argparse.BooleanOptionalAction:
        parser.add_argument(*flags.split(), action=kind, help=text)
    elif flags == "--watch":
        parser.add_argument(flags, nargs="?", type=kind, const=2.0, help=text)
    elif isinstance(kind, str):
        parser.add_argument(*flags.split(), metavar=kind, help=text)
    else:
        parser.add_argument(*flags.split(), type=kind, default=default, help=text)


def _groups() -> tuple[argparse.ArgumentParser, argparse.ArgumentParser]:
    """The flag groups every mode shares (database, logging) and those of the modes that load an experiment."""
    common = argparse.ArgumentParser(add_help=False)
    g = common.add_argument_group("database")
    urls = "sqlite:///file.db (default, $TINYVERSE_DB), redis://[user:password@]host:port/0, rediss://"
    g.add_argument("--db", dest="url", help=urls)
    g.add_argument("--host", help="Redis host: shorthand for --db redis://HOST:PORT/0")
    g.add_argument("--port", type=int, help="Redis port (default 6379)")
    g.add_argument("--password", help="Redis password")
    g.add_argument("--tls-ca", metavar="FILE", help="TLS to Redis: the CA certificate that signed the server's")
    g.add_argument("--prefix", "--key-prefix", help="namespace in the database (default: the experiment's name)")
    common.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv for debug)")
    common.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    experiment = argparse.ArgumentParser(add_help=False)
    g = experiment.add_argument_group("experiment")
    g.add_argument("--set", dest="options", metavar="NAME=VALUE", type=parse_set, action="append", default=[],
                   help="an option of the experiment; the first worker stores them, later ones adopt them")  # fmt: skip
    g.add_argument("--device", help="sets $TINYVERSE_DEVICE for the experiment (auto, cpu, cuda, cuda:1, ...)")
    return common, experiment


def build_parser(epilog: str | None = None) -> argparse.ArgumentParser:
    """The parser of every mode; ``epilog`` ends each experiment mode's --help (its options)."""
    common, experiment = _groups()
    parser = _Parser(
        prog="python -m tinyverse",
        usage="python -m tinyverse [EXPERIMENT.py] MODE [options]",
        description="tinyverse: players record sessions, trainers learn from them, all through one database.",
        epilog="example: python -m tinyverse examples/cartpole_dqn.py play -b 4",
    )
    parser.add_argument("--version", action="version", version=f"tinyverse {__version__}")
    sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    for name, fn in MODES.items():
        doc, needs = fn.__doc__.strip(), name in NEEDS_EXPERIMENT
        prog = f"python -m tinyverse {'EXPERIMENT.py' if needs else '[EXPERIMENT.py]'} {name}"
        p = sub.add_parser(name, parents=[common, experiment] if needs else [common], help=doc, description=doc,
                           prog=prog, epilog=epilog if needs else None,
                           formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
        for row in FLAGS.get(name, []):
            _add(p, *row)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    experiment = None
    if argv and argv[0] not in MODES and not argv[0].startswith("-"):
        experiment, argv = argv[0], argv[1:]
    args = build_parser(_options_help(experiment, argv)).parse_args(argv)
    args.experiment = experiment
    if args.mode in NEEDS_EXPERIMENT and experiment is None:
        raise TinyverseError(f"{args.mode} needs an experiment: python -m tinyverse EXPERIMENT.py {args.mode}")
    args.prefix_given = args.prefix is not None
    if args.prefix is None:
        args.prefix = Path(experiment).stem if experiment else "tinyverse"
    errors.INVOKED.update(experiment=experiment or "EXPERIMENT.py", prefix=args.prefix if args.prefix_given else None)
    if args.host or args.port or args.password:
        auth = f":{quote(args.password, safe='')}@" if args.password else ""
        args.url = f"redis://{auth}{args.host or 'localhost'}:{args.port or 6379}/0"
    args.url = args.url or os.environ.get("TINYVERSE_DB") or DEFAULT_URL
    if args.tls_ca:  # TLS: rediss://, and redis-py reads the CA from the URL's query
        path = Path(args.tls_ca).resolve()
        if not path.is_file() or not args.url.startswith(("redis://", "rediss://")):
            raise TinyverseError(f"--tls-ca {args.tls_ca}: want the CA certificate file (PEM) of a Redis server")
        args.url = "rediss://" + args.url.split("://", 1)[1] + ("&" if "?" in args.url else "?")
        args.url += f"ssl_ca_certs={quote(str(path))}"
    return args


def _options_help(experiment: str | None, argv: list[str]) -> str | None:
    """The experiment's options for ``EXP MODE --help``: name, default, type, stored value, docstring."""
    if experiment is None or not {"-h", "--help"} & set(argv):
        return None
    try:
        args = parse([experiment, *(a for a in argv if a not in ("-h", "--help"))])
        return "\n  ".join([f"options of {experiment} (--set NAME=VALUE):", *_options(args)])
    except TinyverseError as e:
        return f"options of {experiment}: {e}"


def _options(args) -> list[str]:
    """One line an option of the experiment: default, type, the value stored in the namespace if any, its help."""
    factory = getattr(import_file(args.experiment), "make_experiment", None)
    if not callable(factory):
        return []
    try:
        stored = connect(args.url, args.prefix, retry_for=2, create=False).setting("options")
    except TinyverseError:  # no database yet: no stored options
        stored = None
    return describe(factory, stored) or ["(none: its make_experiment takes no Args)"]


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
    except KeyboardInterrupt:
        print("tinyverse: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os._exit(0)
    return 1
