"""The run's options: the first worker stores them, later ones adopt them, a conflicting ``--set``
is refused."""

import dataclasses
import logging
import types
import typing

from .database import Database
from .errors import ExperimentError, command

log = logging.getLogger(__name__)


def resolve(kind: type, path: str, db: Database | None, chosen: dict):
    """``(args, the file's defaults)``: ``chosen`` (typed) over the options stored in ``db`` over
    the defaults."""
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
        defaults = {} if required else dataclasses.asdict(kind())
    except Exception as e:  # a check of the options' own (__post_init__)
        raise ExperimentError(f"options of {path}: {type(e).__name__}: {e}") from None
    for key, value in chosen.items():  # compared as resolved: "none" may stand for a preset's value
        if key in stored and stored[key] != getattr(args, key):
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
    return args, defaults


def store(exp, db) -> None:
    """Store the experiment's options (and the file's defaults) in ``db`` unless some are: a run's
    first write."""
    if exp.options is None:
        return
    db.claim("defaults", exp.option_defaults)
    if (stored := db.claim("options", exp.options)) != exp.options:
        key = next(k for k in exp.options if stored.get(k) != exp.options[k])
        raise ExperimentError(
            f"another worker stored option {key}={stored.get(key)!r} in prefix {db.prefix} "
            f"meanwhile, this one has {exp.options[key]!r}: start this worker again to adopt the "
            "stored options"
        )


def _mistyped(kind: type, key: str, value) -> str | None:
    """``key=value, not TYPE`` if ``value`` is not what ``--set`` makes of the option's type."""
    hint = typing.get_type_hints(kind)[key]
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = set(typing.get_args(hint)) if union else {hint}
    settable = kinds <= {bool, int, float, str, type(None)}  # others go unchecked
    if settable and type(value) not in kinds | ({int} if float in kinds else set()):  # int: a float
        return f"{key}={value!r:.60}, not {getattr(hint, '__name__', hint)}"
    return None
