"""The run's options: the first worker stores them, later ones adopt them, a conflicting ``--set``
is refused unless the option is tunable (in the dataclass's ``TUNABLE``): then it is stored, with
the update it changed at, and running workers adopt it at their next heartbeat."""

import dataclasses
import logging
import time
import types
import typing

from .database import Database
from .errors import ExperimentError, TinyverseError, command
from .settings import plain

log = logging.getLogger(__name__)


def resolve(kind: type, path: str, db: Database | None, chosen: dict, tune: bool = True):
    """``(args, the file's defaults)``: ``chosen`` (typed) over the options stored in ``db`` over
    the defaults; a chosen tunable option that differs from the stored one is stored (``tune``) or
    kept to this process (an eval's)."""
    fields = {f.name: f for f in dataclasses.fields(kind)}
    stored = {} if db is None else db.setting("options") or {}
    began = {} if db is None else db.setting("defaults") or {}  # the file's defaults at the start
    prefix = None if db is None else db.prefix
    afresh = f"use another --prefix, or start afresh with {command('clear --all', prefix)}"
    if unknown := [key for key in stored if key not in fields]:
        where = f"stored in prefix {prefix}"
        raise ExperimentError(f"{path} has no option {unknown[0]!r}, {where}: {afresh}")
    if wrong := [w for key, value in stored.items() if (w := _mistyped(kind, key, value))]:
        raise ExperimentError(f"{path}: prefix {prefix} stores option {wrong[0]}: {afresh}")
    try:
        args = kind(**{**stored, **chosen})
        missing = dataclasses.MISSING
        required = any(f.default is f.default_factory is missing for f in fields.values())
        defaults = {} if required else plain(kind())
    except Exception as e:  # a check of the options' own (__post_init__)
        raise ExperimentError(f"options of {path}: {type(e).__name__}: {e}") from None
    tunable = getattr(kind, "TUNABLE", ())
    changed = {k: getattr(args, k) for k in chosen if k in stored and stored[k] != getattr(args, k)}
    for key, value in chosen.items():  # compared as resolved: "none" may stand for a preset's value
        if key in changed and key not in tunable:
            raise ExperimentError(
                f"option {key}={value!r} conflicts with {key}={stored[key]!r}, stored in prefix "
                f"{prefix} by the run's first worker: drop --set {key}, {afresh}"
            )
    edited = [  # the file's default changed since the run began, and the stored one is not it
        f"{k}: default now {v!r}, stored {stored[k]!r}"
        for k, v in defaults.items()
        if k in stored and k not in chosen and began.get(k, v) != v and stored[k] != v
    ]
    if edited:
        said = "%s's defaults changed since the run began; the stored ones are used (%s)"
        log.warning(said, path, "; ".join(edited))
    if changed and tune:
        _tune(db, stored, changed)
    elif changed:
        log.info("options %s for this process only: prefix %s keeps its own", changed, prefix)
    return args, defaults


def _tune(db, stored: dict, changed: dict) -> None:
    """Store the tunable options ``changed`` in the running prefix, and when they changed."""
    at = {"update": db.counter("updates"), "time": time.time()}
    history = db.setting("tuned") or []
    history += [{"option": k, "old": stored[k], "new": v, **at} for k, v in changed.items()]
    db.put("options", {**stored, **changed})  # before the count the workers watch
    db.put("tuned", history)
    db.add_to_counter("tunes", 1)
    said = ", ".join(f"{k}={v!r}" for k, v in changed.items())
    log.warning("tuned %s in prefix %s at update %d", said, db.prefix, at["update"])


def adopt(args, db, seen: int) -> int:
    """Set ``args``'s tunable options to the stored ones if the count of changes is not ``seen``
    (one read if it is); the count. A stored value of the wrong type is said and ignored."""
    try:
        if args is None or (count := db.counter("tunes")) == seen:
            return seen
        stored = db.setting("options") or {}
    except TinyverseError as e:
        log.warning("tuned options not read: %s", e)
        return seen
    for key in getattr(type(args), "TUNABLE", ()):
        if key not in stored or stored[key] == getattr(args, key):
            continue
        if wrong := _mistyped(type(args), key, stored[key]):
            log.warning("ignored the stored option %s (the database's is junk)", wrong)
        else:
            log.info("option %s: %r -> %r (tuned)", key, getattr(args, key), stored[key])
            setattr(args, key, stored[key])
    return count


def store(run, db) -> None:
    """Store the run's options (and the file's defaults) in ``db`` unless some are: a run's first
    write (``run``: the experiment's :class:`~tinyverse.settings.Run`)."""
    if run.options is None:
        return
    db.claim("defaults", run.option_defaults)
    if (stored := db.claim("options", run.options)) != run.options:
        key = next(k for k in run.options if stored.get(k) != run.options[k])
        raise ExperimentError(
            f"another worker stored option {key}={stored.get(key)!r} in prefix {db.prefix} "
            f"meanwhile, this one has {run.options[key]!r}: start this worker again to adopt the "
            "stored options"
        )


def history(db) -> list[str]:
    """The tuned changes stored in ``db``, a line each (read back untrusted: shown as reprs)."""
    lines = []
    for c in db.setting("tuned") or []:
        c = c if isinstance(c, dict) else {}
        at = c.get("time") if type(c.get("time")) in (int, float) else 0
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))
        change = f"{c.get('old')!r:.40} -> {c.get('new')!r:.40}"
        lines.append(f"{c.get('option')!r:.40}: {change} at update {c.get('update')!r:.20}, {when}")
    return lines


def _mistyped(kind: type, key: str, value) -> str | None:
    """``key=value, not TYPE`` if ``value`` is not what ``--set`` makes of the option's type."""
    hint = typing.get_type_hints(kind)[key]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = set(typing.get_args(hint)) if union else {hint}
    settable = kinds <= {bool, int, float, str, type(None)}  # others go unchecked
    if settable and type(value) not in kinds | ({int} if float in kinds else set()):  # int: a float
        return f"{key}={value!r:.60}, not {getattr(hint, '__name__', hint)}"
    return None
