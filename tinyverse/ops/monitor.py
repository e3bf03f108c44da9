"""Watching training: ``info`` (the dashboard) and the options listed; learning curves: ``plot``."""

import ast
import dataclasses
import inspect
import time
import typing

from .. import readable
from ..database import TOOL_WAIT, Database, connect, masked
from ..errors import TinyverseError, command, typed
from ..league import games, table
from ..loader import dataclass_of, import_file
from ..options import history
from ..settings import as_stored
from .bottleneck import bottleneck


def mode_info(args):
    """The dashboard: sessions, options, params, the pace, live workers and their lag, training."""
    shown = option_lines(args) if args.experiment else []
    listed = "".join(f"\n  option    {line}" for line in shown)
    while True:
        text = "\n".join(info_text(db, args.last) for db in namespaces(args))
        # the commands it names run on the file given
        text = typed(text or f"no experiments in {masked(args.url)}", args.experiment)
        if not args.watch:
            print(text + listed)
            return
        print(f"\033[H\033[J{text}{listed}\n\n(every {args.watch:g}s; Ctrl-C to quit)", flush=True)
        time.sleep(args.watch)


def namespaces(args) -> list[Database]:
    """The experiment's namespace; with no experiment or prefix named, every one holding data."""
    db = connect(args.url, args.prefix, TOOL_WAIT, create=False)
    if args.experiment or args.prefix_given:
        return [db]
    return [d for d in (connect(args.url, p, TOOL_WAIT) for p in db.namespaces()) if _holds_data(d)]


def _holds_data(db: Database) -> bool:
    """Whether a namespace holds anything; junk records count (clear --all must reach them)."""
    try:
        return bool(db.count_sessions().added or db.params_version() is not None or db.workers())
    except TinyverseError:
        return True


def option_lines(args) -> list[str]:
    """One line an option of the experiment: default, type, its stored value if any, its help."""
    factory = getattr(import_file(args.experiment), "make_experiment", None)
    if not callable(factory):
        return []
    try:
        stored = connect(args.url, args.prefix, TOOL_WAIT, create=False).setting("options")
    except TinyverseError:  # no database yet: no stored options
        stored = None
    return describe(factory, stored) or ["(none: its make_experiment takes no Args)"]


def options_help(experiment: str | None, argv: list[str], parse) -> str | None:
    """The experiment's options for ``EXP MODE --help`` (``parse``: the CLI's, for the database)."""
    if experiment is None or not {"-h", "--help"} & set(argv):
        return None
    try:
        lines = option_lines(parse([a for a in argv if a not in ("-h", "--help")]))
        return "\n  ".join([f"options of {experiment} (--set NAME=VALUE):", *lines])
    except TinyverseError as e:
        return f"options of {experiment}: {e}"


def describe(factory, stored: dict | None = None) -> list[str]:
    """One line an option: ``name=default (type, stored value if it differs): its docstring``."""
    kind = dataclass_of(factory)
    if kind is None:
        return []
    stored = stored or {}
    docs = _field_docs(kind)
    hints = typing.get_type_hints(kind)
    lines = []
    for f in dataclasses.fields(kind):
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
        shown = "required" if default is dataclasses.MISSING else repr(default)
        same = as_stored(stored.get(f.name, default)) == as_stored(default)  # tuples: lists
        now = "" if same else f", stored {stored[f.name]!r}"
        kind_name = getattr(hints[f.name], "__name__", str(hints[f.name]))
        now += ", tunable" if f.name in getattr(kind, "TUNABLE", ()) else ""  # tune --set takes it
        lines.append(f"{f.name}={shown} ({kind_name}{now}): {docs.get(f.name, '')}".rstrip(": "))
    return lines


def _field_docs(kind) -> dict[str, str]:
    """Each field's docstring (PEP 257 attribute docstrings), from its class's and bases' source."""
    docs = {}
    for cls in reversed(kind.__mro__[:-1]):  # a subclass's docstring wins
        try:
            body = ast.parse(inspect.getsource(cls)).body[0].body
        except (OSError, TypeError, SyntaxError):  # no source, or a class in a function (indented)
            continue
        for node, after in zip(body, body[1:], strict=False):
            text = after.value if isinstance(after, ast.Expr) else None  # a string under a field
            if isinstance(node, ast.AnnAssign) and isinstance(text, ast.Constant):
                docs[node.target.id] = " ".join(str(text.value).split())
    return docs


def info_text(db: Database, last: int = 100) -> str:
    """The dashboard of one namespace as text."""
    stored, added = db.count_sessions()
    workers = db.workers()  # typed, or one line
    saved = db.params_saved()
    now = time.time()
    lines = [f"[{db.prefix}] {db.url}"]
    if options := db.setting("options"):
        shown = [f"{k}={v}" for k, v in options.items()]  # quoted if a terminal would obey it
        lines.append("  options   " + ", ".join(s if s.isprintable() else repr(s) for s in shown))
    lines += [f"  tuned     {line}" for line in history(db)]
    if not (added or saved or workers):
        return "\n".join(lines + [f"  empty: start a player with {command('play', db.prefix)}"])
    corrupt = f", {n:,} corrupt removed" if (n := db.counter("corrupt")) else ""
    capacity = db.capacity() or 0
    sessions = f"  sessions  {stored:,} stored of {capacity:,} capacity, {added:,} ever added"
    lines.insert(1, sessions + corrupt)
    held = (
        "none" if saved is None else f"version {saved.version}, saved {_age(now - saved.time)} ago"
    )
    lines.append(f"  params    {held}")
    if snapshots := db.snapshots()[::-1]:  # the newest first
        shown = [f"{s.name} v{s.version} ({_age(now - s.time)} ago)" for s in snapshots[:8]]
        more = f", {len(snapshots) - 8} older" if len(snapshots) > 8 else ""
        lines.append(f"  snapshots {', '.join(shown)}{more}")
    pace = next((w["pace"] for w in workers if w.get("pace")), None)
    if pace and pace["updates_per_step"]:
        updates = db.counter("updates")
        played = max(0, db.env_steps(pace["session_length"]) - pace["learning_starts"])
        actual = f"{updates / played:.3g}" if played else "-"
        target = f"target {pace['updates_per_step']:g} updates an env step"
        after = f"after {pace['learning_starts']:,}, slack {pace['pace_slack']:,}"
        lines.append(f"  pace      {target} ({after}), actual {actual} ({updates:,} updates)")
    if limit := bottleneck(workers):
        lines.append(f"  limit     {limit}")
    lines += [_worker_line(w, saved, now) for w in workers] or ["  workers   none alive"]
    if returns := db.recent_returns(last):
        low, high = readable.number(min(returns)), readable.number(max(returns))
        summary = f"mean {readable.spread(returns)}, min {low}, max {high}"
        lines.append(f"  returns   last {len(returns)}: {summary}")
    lines += table(played) if (played := games(db.metrics("games", 20_000))) else []
    return "\n".join(lines + _training_lines(db, {w["id"] for w in workers}, now))


def _training_lines(db: Database, live: set[str], now: float, last: int = 1000) -> list[str]:
    """The latest metrics of each live trainer; the trainers that stopped in one line (a line each
    would pile up over restarts), as far as the newest ``last`` reports tell."""
    reports = db.metrics("train", last)
    latest = {m.get("worker"): m for m in reports}
    lines = [f"  training  {_numbers(m)} ({_ago(m, now)})" for w, m in latest.items() if w in live]
    if past := [m for w, m in latest.items() if w not in live]:
        newest = max(past, key=lambda m: m.get("time", 0))
        count = f"{len(past)} trainer{'s' if len(past) > 1 else ''}"
        if len(reports) == last:  # older reports were not read: there may be more
            count = f"at least {count}"
        lines.append(f"  stopped   {count}, the last {_ago(newest, now)}: {_numbers(newest)}")
    return lines


def _numbers(report: dict) -> str:
    """A trainer report's numbers, under printable names: any other value may be anything."""
    found = [(k, v) for k, v in report.items() if type(v) in (int, float) and k.isprintable()]
    return ", ".join(f"{k} {v:.4g}" for k, v in found if k not in ("time", "version", "steps"))


def _ago(report: dict, now: float) -> str:
    return f"{_age(now - report['time'])} ago" if "time" in report else "at a time not stored"


def _worker_line(w: dict, saved, now: float) -> str:
    rate = f"{w.get('steps_per_s', 0):,.0f} steps/s"
    if w["role"] != "player":
        rate = f"{w.get('updates_per_s', 0):,.1f} updates/s"
    used = f"  params v{w['version']}" if w.get("version") is not None else ""
    used += f", lag {saved.version - w['version']}" if used and saved is not None else ""
    if w.get("pushes"):
        used += f"  {w['pushes']:,} pushes, {w.get('conflicts', 0):,} races lost"
    used += f"  waiting {w['waiting']}" if w.get("waiting") else ""
    where = f"{w['host']} pid {w['pid']}" + (f" on {w['place']}" if w.get("place") else "")
    return f"  {w['role']:<8}  {where}  up {_age(now - w['started'])}  {rate}{used}"


def _age(seconds: float) -> str:
    s = int(seconds)
    return (
        f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h{s % 3600 // 60:02d}m"
    )
