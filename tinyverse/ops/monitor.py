"""Watching training: ``info`` (the dashboard) and ``plot`` (learning curves); TensorBoard files: ``tensorboard``."""

import ast
import dataclasses
import inspect
import time
import typing
from pathlib import Path

import numpy as np

from ..database import TOOL_WAIT, Database, connect, masked
from ..errors import TinyverseError, command, install, typed
from ..loader import dataclass_of, import_file


def mode_info(args):
    """Dashboard: sessions, options, params and their age, the pace, live workers with their lag, returns, training."""
    listed = "".join(f"\n  option    {line}" for line in option_lines(args)) if args.experiment else ""
    while True:
        text = "\n".join(info_text(db, args.last) for db in namespaces(args)) or f"no experiments in {masked(args.url)}"
        text = typed(text, args.experiment)  # the commands it names run on the file given
        if not args.watch:
            print(text + listed)
            return
        print(f"\033[H\033[J{text}{listed}\n\n(every {args.watch:g}s; Ctrl-C to quit)", flush=True)
        time.sleep(args.watch)


def namespaces(args) -> list[Database]:
    """The experiment's namespace, or every namespace with data when no experiment or prefix is named."""
    db = connect(args.url, args.prefix, TOOL_WAIT, create=False)
    if args.experiment or args.prefix_given:
        return [db]
    return [d for d in (connect(args.url, p, TOOL_WAIT) for p in db.namespaces()) if _holds_data(d)]


def _holds_data(db: Database) -> bool:
    """Whether a namespace holds anything; one whose records are junk does too (clear --all must reach it)."""
    try:
        return bool(db.count_sessions().added or db.params_version() is not None or db.workers())
    except TinyverseError:
        return True


def option_lines(args) -> list[str]:
    """One line an option of the experiment: default, type, the value stored in the namespace if any, its help."""
    factory = getattr(import_file(args.experiment), "make_experiment", None)
    if not callable(factory):
        return []
    try:
        stored = connect(args.url, args.prefix, TOOL_WAIT, create=False).setting("options")
    except TinyverseError:  # no database yet: no stored options
        stored = None
    return describe(factory, stored) or ["(none: its make_experiment takes no Args)"]


def options_help(experiment: str | None, argv: list[str], parse) -> str | None:
    """The experiment's options for ``EXP MODE --help`` (``parse``: the CLI's, for the database of ``argv``)."""
    if experiment is None or not {"-h", "--help"} & set(argv):
        return None
    try:
        lines = option_lines(parse([a for a in argv if a not in ("-h", "--help")]))
        return "\n  ".join([f"options of {experiment} (--set NAME=VALUE):", *lines])
    except TinyverseError as e:
        return f"options of {experiment}: {e}"


def describe(factory, stored: dict | None = None) -> list[str]:
    """One line an option: ``name=default (type, stored value if it differs): its docstring``."""
    kind, stored = dataclass_of(factory), stored or {}
    if kind is None:
        return []
    docs, hints, lines = _field_docs(kind), typing.get_type_hints(kind), []
    for f in dataclasses.fields(kind):
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        shown = "required" if default is dataclasses.MISSING else repr(default)
        now = f", stored {stored[f.name]!r}" if stored.get(f.name, default) != default else ""
        kind_name = getattr(hints[f.name], "__name__", str(hints[f.name]))
        lines.append(f"{f.name}={shown} ({kind_name}{now}): {docs.get(f.name, '')}".rstrip(": "))
    return lines


def _field_docs(kind) -> dict[str, str]:
    """The docstring under each field (PEP 257 attribute docstrings), read from the class's source and its bases'."""
    docs = {}
    for cls in reversed(kind.__mro__[:-1]):  # a subclass's docstring wins
        try:
            body = ast.parse(inspect.getsource(cls)).body[0].body
        except (OSError, TypeError, SyntaxError):  # no source, or a class defined inside a function (indented)
            continue
        for node, after in zip(body, body[1:], strict=False):
            text = getattr(after, "value", None)
            if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(text, ast.Constant):
                docs[node.target.id] = " ".join(str(text.value).split())
    return docs


def info_text(db: Database, last: int = 100) -> str:
    """The dashboard of one namespace as text."""
    stored, added = db.count_sessions()
    workers, saved, now = db.workers(), db.params_saved(), time.time()  # typed, or one line
    lines = [f"[{db.prefix}] {db.url}"]
    if options := db.setting("options"):
        shown = [f"{k}={v}" for k, v in options.items()]  # quoted if a terminal would obey it
        lines.append("  options   " + ", ".join(s if s.isprintable() else repr(s) for s in shown))
    if not (added or saved or workers):
        return "\n".join(lines + [f"  empty: start a player with {command('play', db.prefix)}"])
    corrupt = f", {n:,} corrupt removed" if (n := db.counter("corrupt")) else ""
    lines.insert(1, f"  sessions  {stored:,} stored of {db.capacity() or 0:,} capacity, {added:,} ever added{corrupt}")
    held = "none" if saved is None else f"version {saved.version}, saved {_age(now - saved.time)} ago"
    lines.append(f"  params    {held}")
    pace = next((w["pace"] for w in workers if w.get("pace")), None)
    if pace and pace["updates_per_step"]:
        updates = db.counter("updates")
        played = max(0, db.env_steps(pace["session_length"]) - pace["learning_starts"])
        actual = f"{updates / played:.3g}" if played else "-"
        lines.append(
            f"  pace      target {pace['updates_per_step']:g} updates an env step (after {pace['learning_starts']:,}, "
            f"slack {pace['pace_slack']:,}), actual {actual} ({updates:,} updates)"
        )
    lines += [_worker_line(w, saved, now) for w in workers] or ["  workers   none alive"]
    if returns := db.recent_returns(last):
        r = np.array(returns)
        lines.append(f"  returns   last {len(r)}: mean {r.mean():.1f}, min {r.min():.1f}, max {r.max():.1f}")
    latest = {m.get("worker"): m for m in db.metrics("train", 200)}  # each trainer's latest metrics
    for m in latest.values():  # its numbers, under printable names: any other value may be anything
        ago = f" ({_age(now - m['time'])} ago)" if "time" in m else ""
        found = [(k, v) for k, v in m.items() if type(v) in (int, float) and k.isprintable()]
        shown = ", ".join(f"{k} {v:.4g}" for k, v in found if k not in ("time", "version", "steps"))
        lines.append(f"  training  {shown}{ago}")
    return "\n".join(lines)


def _worker_line(w: dict, saved, now: float) -> str:
    player = w["role"] == "player"
    rate = f"{w.get('steps_per_s', 0):,.0f} steps/s" if player else f"{w.get('updates_per_s', 0):,.1f} updates/s"
    used = f"  params v{w['version']}" if w.get("version") is not None else ""
    used += f", lag {saved.version - w['version']}" if used and saved is not None else ""  # staleness
    used += f"  {w['pushes']:,} pushes, {w.get('conflicts', 0):,} races lost" if w.get("pushes") else ""
    used += f"  waiting {w['waiting']}" if w.get("waiting") else ""
    where = f"{w['host']} pid {w['pid']}" + (f" on {w['place']}" if w.get("place") else "")
    return f"  {w['role']:<8}  {where}  up {_age(now - w['started'])}  {rate}{used}"


def _age(seconds: float) -> str:
    s = int(seconds)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h{s % 3600 // 60:02d}m"


def mode_plot(args):
    """Draw learning curves (return vs env steps and wall time, trainer loss) into a PNG."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise TinyverseError(f"plot needs matplotlib: {install('matplotlib')}") from None
    kinds = sorted(Figure().canvas.get_supported_filetypes())  # said before drawing
    if Path(args.output).suffix.lower().removeprefix(".") not in kinds:
        raise TinyverseError(f"plot -o {args.output}: want an image ending .{', .'.join(kinds)}")
    db = connect(args.url, args.prefix, TOOL_WAIT, create=False)
    if not (episodes := db.metrics("episodes")):
        raise TinyverseError(f"no episode returns stored under prefix {db.prefix!r}: play first, or check --prefix")
    returns, k = np.array([m["return"] for m in episodes]), min(20, len(episodes))
    start = episodes[0]["time"]
    curves = {
        "env steps": [m["steps"] for m in episodes],
        "wall time (min)": [(m["time"] - start) / 60 for m in episodes],
    }
    fig = Figure(figsize=(15, 4), layout="tight")
    axes = fig.subplots(1, 3)
    for ax, (label, x) in zip(axes, curves.items(), strict=False):
        ax.plot(x, returns, ".", alpha=0.3, label="episode")
        ax.plot(x[k - 1 :], np.convolve(returns, np.ones(k) / k, mode="valid"), label=f"mean of {k}")
        ax.set(xlabel=label, ylabel="return")
        ax.legend()
    train = db.metrics("train")
    losses = [(m["updates"], m["loss"]) for m in train if {"loss", "updates"} <= m.keys()]
    axes[2].set(xlabel="trainer updates", ylabel="loss", title="" if losses else "no trainer loss stored")
    if losses:
        axes[2].plot(*zip(*losses, strict=True), ".-")
        axes[2].set_yscale("log" if min(v for _, v in losses) > 0 else "linear")
    fig.suptitle(f"{db.prefix}: {len(returns)} episodes")
    try:
        fig.savefig(args.output, dpi=80)
    except OSError as e:  # the folder went, or filled up, since -o was checked
        raise TinyverseError(f"cannot write {args.output} ({e}): pick another -o") from None
    print(f"wrote {args.output}")
