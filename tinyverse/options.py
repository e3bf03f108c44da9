"""Experiment options: the dataclass ``make_experiment(db, args: Args)`` takes, filled by ``--set``, kept by the run."""

import argparse
import dataclasses
import inspect
import logging
import types
import typing

from .errors import ExperimentError, command

log = logging.getLogger(__name__)
BOOLS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}


def parse_set(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` from the command line (an argparse type)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"want NAME=VALUE, got {text!r}")
    name, value = text.split("=", 1)
    return name.strip(), value


def dataclass_of(factory) -> type | None:
    """The options dataclass of ``make_experiment``'s second parameter (``Args`` or ``Args | None``), or None."""
    names = list(inspect.signature(factory).parameters)
    hint = typing.get_type_hints(factory).get(names[1]) if len(names) > 1 else None
    kinds = typing.get_args(hint) or [hint]
    return next((k for k in kinds if isinstance(k, type) and dataclasses.is_dataclass(k)), None)


def resolve(factory, path: str, db, given: dict[str, str]):
    """``(args, the file's defaults)``: ``given`` over those stored in ``db`` over the defaults; or (None, None)."""
    kind = dataclass_of(factory)
    if kind is None:
        if given:
            raise ExperimentError(f"{path} takes no options: its make_experiment(db, args: Args) needs a dataclass")
        return None, None
    fields, hints = {f.name: f for f in dataclasses.fields(kind)}, typing.get_type_hints(kind)
    if unknown := [key for key in given if key not in fields]:
        raise ExperimentError(f"{path} has no option {unknown[0]!r}; its options: {', '.join(fields)}")
    chosen = {key: _parse(key, text, hints[key]) for key, text in given.items()}
    stored, began = ({}, {}) if db is None else (db.setting("options") or {}, db.setting("defaults") or {})
    afresh = f"use another --prefix, or start afresh with {command('clear --all')}"
    if unknown := [key for key in stored if key not in fields]:
        raise ExperimentError(f"{path} has no option {unknown[0]!r}, stored in prefix {db.prefix}: {afresh}")
    try:
        args = kind(**{**stored, **chosen})
        required = any(f.default is f.default_factory is dataclasses.MISSING for f in fields.values())
        defaults = {} if required else dataclasses.asdict(kind())
    except Exception as e:  # a check of the options' own (__post_init__)
        raise ExperimentError(f"options of {path}: {type(e).__name__}: {e}") from None
    for key, value in chosen.items():  # compared as resolved: "none" may stand for a preset's value
        if key in stored and stored[key] != getattr(args, key):
            raise ExperimentError(
                f"option {key}={value!r} conflicts with {key}={stored[key]!r}, stored in prefix {db.prefix} by "
                f"the run's first worker: drop --set {key}, {afresh}"
            )
    edited = [  # the file's default changed since the run began, and the stored value is not the new one
        f"{k}: default now {v!r}, stored {stored[k]!r}"
        for k, v in defaults.items()
        if k in stored and k not in chosen and began.get(k, v) != v and stored[k] != v
    ]
    if edited:
        log.warning("%s's defaults changed since the run began; the stored ones are used (%s)", path, "; ".join(edited))
    return args, defaults


def store(exp, db) -> None:
    """Store the experiment's options (and the file's defaults) in ``db`` unless some are: a run's first write."""
    if exp.options is None:
        return
    db.claim("defaults", exp.option_defaults)
    if (stored := db.claim("options", exp.options)) != exp.options:
        key = next(k for k in exp.options if stored.get(k) != exp.options[k])
        raise ExperimentError(
            f"another worker stored option {key}={stored.get(key)!r} in prefix {db.prefix} meanwhile, this one "
            f"has {exp.options[key]!r}: start this worker again to adopt the stored options"
        )


def _parse(key: str, text: str, hint):
    """``text`` as the field's type: bool, int, float or str ("none" for an optional field)."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] if union else [hint]
    if union and text.lower() == "none":
        return None
    if len(kinds) != 1 or kinds[0] not in (bool, int, float, str):
        raise ExperimentError(f"option {key} has type {hint}: only bool, int, float and str options can be set")
    try:
        return BOOLS[text.lower()] if kinds[0] is bool else kinds[0](text)
    except (KeyError, ValueError):
        raise ExperimentError(f"option {key}={text!r}: not a {kinds[0].__name__}") from None
