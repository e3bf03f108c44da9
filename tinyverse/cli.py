"""The runner: ``python -m tinyverse [EXPERIMENT.py] MODE [options]``; a mode's docstring is its
--help."""

import argparse
import logging
import os
import re
import sys
from itertools import pairwise
from pathlib import Path

from . import __version__
from .database import TOOL_WAIT, connect, url_from
from .errors import TinyverseError, command, masked, typed
from .evaluation import against, chosen, evaluate, put
from .flags import FLAGS, within
from .loader import load_experiment, parse_set
from .ops import export, launcher, monitor, plot, stop, tensorboard
from .player import play
from .trainer import train


def mode_play(args):
    """Play B environments and record sessions into the database (runs until stopped)."""
    db = connect(args.url, args.prefix, capacity=args.buffer_size)
    exp = load_experiment(args.experiment, db, args.options)
    batch_size = args.batch_size or exp.run.settings.play_batch_size
    play(exp, db, batch_size, args.rounds, args.sync_every, args.seed)


def mode_train(args):
    """Train on sessions sampled from the database and publish params (runs until stopped)."""
    db = connect(args.url, args.prefix, capacity=args.buffer_size)
    exp = load_experiment(args.experiment, db, args.options)
    events = tensorboard.EventWriter(args.logdir, db) if args.logdir else None  # flushed at reports
    settings = exp.run.settings
    batch_size = args.batch_size or settings.train_batch_size
    save_every = args.save_every or settings.save_every
    on_report = events and events.report
    train(exp, db, batch_size, args.updates, save_every, sync=args.sync, on_report=on_report)


def mode_eval(args):
    """Play N full episodes with the latest params (or --params: a snapshot's, a version's, a
    file's); print each return, mean ± std; with --opponent, a game's score against it."""
    record = None if args.no_record else args.record
    if args.params and export.a_file(args.params):  # no database: the file holds it all
        exp, meta, _ = export.load(args.params, args.experiment, args.options)
        against(exp, args.opponent)
        evaluate(exp, None, args.episodes, record, args.seed, version=int(meta["version"]))
        return
    db = connect(args.url, args.prefix, TOOL_WAIT, create=False)
    exp = load_experiment(args.experiment, db, args.options, tune=False)  # --set: this eval's only
    games = db if against(exp, args.opponent) else None  # a named match's games go into the ratings
    if args.params is None:
        evaluate(exp, db, args.episodes, record, args.seed, games=games)
        return
    version = put(exp, db, chosen(db, args.params))
    evaluate(exp, None, args.episodes, record, args.seed, version=version, games=games)


def mode_tune(args):
    """Change tunable options (--set) of a running prefix: stored with the update they changed at,
    adopted by its workers at their next heartbeat; nothing is cleared."""
    db = connect(args.url, args.prefix, TOOL_WAIT, create=False)
    if not args.options or db.setting("options") is None:
        need = f"tune needs --set NAME=VALUE and a run in prefix {args.prefix}"
        raise TinyverseError(f"{need}: start one with {command('play', args.prefix)}")
    load_experiment(args.experiment, db, args.options)  # a structural option: refused


MODES = {"play": mode_play, "train": mode_train, "run": launcher.mode_run, "eval": mode_eval}
MODES |= {"clear": stop.mode_clear, "info": monitor.mode_info, "plot": plot.mode_plot}
MODES |= {"export": export.mode_export, "import": export.mode_import, "tune": mode_tune}
NEEDS_EXPERIMENT = {"play", "train", "run", "eval", "export", "import", "tune"}
RAW = argparse.RawDescriptionHelpFormatter


class _Parser(argparse.ArgumentParser):
    """argparse whose usage errors are one line, as every tinyverse error, with no secret in it."""

    def parse_args(self, args=None, namespace=None):
        parsed, extra = self.parse_known_args(args, namespace)
        if extra:  # what follows a mistyped flag may be its password (--pasword PW): not shown
            shown = [extra[0]]
            for before, word in pairwise(extra):
                shown.append("***" if before.startswith("-") and not word.startswith("-") else word)
            self.error(f"unrecognized arguments: {' '.join(shown)}")
        return parsed

    def error(self, message):
        flag_and_value = r"(?<!\S)(--?[A-Za-z][\w-]*=)\S+"  # --pasword=PW, or an ambiguous --pa=PW
        message = re.sub(flag_and_value, r"\1***", message)
        message = re.sub(r"\S*://\S*", lambda found: masked(found[0]), message)
        raise TinyverseError(f"{message} (see python -m tinyverse --help)")


def build_parser(epilog: str | None = None, positionals: bool = True) -> argparse.ArgumentParser:
    """The parser of every mode; ``epilog`` ends each experiment mode's --help (its options);
    ``positionals`` False: a mode's positional arguments may be left out."""
    common = argparse.ArgumentParser(add_help=False)  # the flags of every mode
    experiment = argparse.ArgumentParser(add_help=False)  # and of those that load an experiment
    g = common.add_argument_group("database")
    urls = "sqlite:///file.db (default, $TINYVERSE_DB), redis://[user:password@]host:port/0, "
    urls += "rediss://"
    g.add_argument("--db", dest="url", help=urls)
    g.add_argument("--host", help="Redis host: shorthand for --db redis://HOST:PORT/0")
    g.add_argument("--port", **within(1, 65535), help="Redis port (default 6379)")
    g.add_argument("--password", help="Redis password (ps shows it: prefer $TINYVERSE_DB)")
    tls = "TLS to Redis: the CA certificate that signed the server's"
    g.add_argument("--tls-ca", metavar="FILE", help=tls)
    namespace = "namespace in the database (default: the experiment's name)"
    g.add_argument("--prefix", "--key-prefix", help=namespace)
    more = "more log output (-vv for debug)"
    common.add_argument("-v", "--verbose", action="count", default=0, help=more)
    common.add_argument("-q", "--quiet", action="store_true", help="warnings and errors only")
    g = experiment.add_argument_group("experiment")
    kept = "an option of the experiment; the first worker stores them, later ones adopt them"
    sets = {"dest": "options", "metavar": "NAME=VALUE", "type": parse_set, "action": "append"}
    g.add_argument("--set", **sets, default=[], help=kept)
    device = "sets $TINYVERSE_DEVICE for the experiment (auto, cpu, cuda, cuda:1, ...)"
    g.add_argument("--device", help=device)
    parser = _Parser(
        prog="python -m tinyverse",
        usage="python -m tinyverse [EXPERIMENT.py] MODE [options]",
        description="tinyverse: players record sessions, trainers learn from them, all through "
        "one database.",
        epilog="example: python -m tinyverse examples/cartpole_dqn.py play -b 4",
    )
    parser.add_argument("--version", action="version", version=f"tinyverse {__version__}")
    sub = parser.add_subparsers(dest="mode", metavar="MODE", required=True)
    for name, fn in MODES.items():
        doc = fn.__doc__.strip()
        needs = name in NEEDS_EXPERIMENT
        prog = f"python -m tinyverse {'EXPERIMENT.py' if needs else '[EXPERIMENT.py]'} {name}"
        kw = {"help": doc, "description": doc, "epilog": epilog if needs else None, "prog": prog}
        parents = [common, experiment] if needs else [common]
        p = sub.add_parser(name, parents=parents, **kw, formatter_class=RAW)
        for flags, keywords, text in FLAGS.get(name, []):
            maybe = {} if positionals or flags.startswith("-") else {"nargs": "?"}
            p.add_argument(*flags.split(), **keywords, **maybe, help=text)
    return parser


def experiment_of(argv: list[str]) -> str | None:
    """The experiment file of ``python -m tinyverse ARGV``, if it names one (it comes first)."""
    return argv[0] if argv and argv[0] not in MODES and not argv[0].startswith("-") else None


def parse(argv: list[str], for_help: bool = False) -> argparse.Namespace:
    """The arguments of ``python -m tinyverse ARGV``, the database URL built from them,
    ``args.options`` a dict. ``for_help``: for the options --help lists, which need the database
    alone: a positional argument may be left out."""
    experiment = experiment_of(argv)
    listed = monitor.options_help(experiment, argv, lambda rest: parse(rest, for_help=True))
    parser = build_parser(listed, positionals=not for_help)
    args = parser.parse_args(argv[1:] if experiment else argv)
    if args.mode in NEEDS_EXPERIMENT and experiment is None:
        raise TinyverseError(f"{args.mode} needs an experiment: {command(args.mode)}")
    args.experiment = experiment
    args.options = dict(getattr(args, "options", []))
    args.prefix_given = args.prefix is not None  # "" too: refused as a bad prefix, not read as none
    if not args.prefix_given:
        args.prefix = Path(experiment).stem if experiment else "tinyverse"
    args.url = url_from(args.url, args.host, args.port, args.password, args.tls_ca)
    return args


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        args = parse(argv)
        level = logging.DEBUG if args.verbose > 1 else logging.INFO
        level = logging.WARNING if args.quiet else level
        shown = "%(asctime)s %(name)s %(levelname)s: %(message)s"
        logging.basicConfig(level=level, format=shown, datefmt="%H:%M:%S")
        logging.getLogger("matplotlib").setLevel(logging.WARNING)  # no "new fontManager" (plot)
        if getattr(args, "device", None):  # experiments read it; run's children inherit it
            os.environ["TINYVERSE_DEVICE"] = args.device
        MODES[args.mode](args)
        return 0
    except TinyverseError as e:
        print(f"tinyverse: error: {typed(str(e), experiment_of(argv))}", file=sys.stderr)
    except KeyboardInterrupt:
        print("tinyverse: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        os._exit(0)
    return 1
