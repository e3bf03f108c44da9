"""Experiment options: the fields of the dataclass that ``make_experiment(db, args: Args)`` takes.

``--set name=value`` fills them (the docstring under each field is its help).
The first worker of a run stores the resolved options in the namespace when it
starts to write (:func:`store`); every later worker adopts them, and a ``--set``
that conflicts with them is an error, so a fleet never splits silently.
"""

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
    """The options dataclass of ``make_experiment``'s second parameter, or None."""
    names = list(inspect.signature(factory).parameters)
    hint = typing.get_type_hints(factory).get(names[1]) if len(names) > 1 else None
    kind = next((k for k in typing.get_args(hint) or [hint] if dataclasses.is_dataclass(k)), None)  # Args | None
    return kind if isinstance(kind, type) else None


def resolve(factory, path: str, db, given: dict[str, str]):
    """(options, the file's defaults as a dict) for ``factory``: ``given`` over those stored in ``db``, over the
    defaults; (None, None) when it takes none. Says when the file's defaults changed since the run stored its own."""
    kind = dataclass_of(factory)
    if kind is None:
        if given:
            raise ExperimentError(f"{path} takes no options: its make_experiment(db, args: Args) needs a dataclass")
        return None, None
    hints, fields = typing.get_type_hints(kind), {f.name: f for f in dataclasses.fields(kind)}
    chosen = {}
    for key, text in given.items():
        if key not in fields:
            raise ExperimentError(f"{path} has no option {key!r}; its options: {', '.join(fields)}")
        chosen[key] = _parse(key, text, hints[key])
    stored = (None if db is None else db.setting("options")) or {}
    afresh = f"use another --prefix, or start afresh with {command('clear --all')}"
    for key in stored.keys() - fields.keys():
        raise ExperimentError(f"{path} has no option {key!r}, stored in prefix {db.prefix}: {afresh}")
    try:
        args = kind(**{**stored, **chosen})
        defaults = dataclasses.asdict(kind()) if all(_has_default(f) for f in fields.values()) else {}
    except Exception as e:  # a check of the options' own (__post_init__)
        raise ExperimentError(f"options of {path}: {type(e).__name__}: {e}") from None
    resolved, before = dataclasses.asdict(args), (None if db is None else db.setting("defaults")) or defaults
    for key, value in chosen.items():  # compared as resolved: "none" may stand for a preset's value
        if key in stored and stored[key] != resolved[key]:
            raise ExperimentError(
                f"option {key}={value!r} conflicts with {key}={stored[key]!r}, stored in prefix {db.prefix} by "
                f"the run's first worker: drop --set {key}, {afresh}"
            )
    if edited := [f"{k}: default now {v!r}, stored {stored[k]!r}" for k, v in defaults.items() if
                  k in stored and k not in chosen and before.get(k) != v and stored[k] != v]:  # fmt: skip
        log.warning(
            "%s's defaults changed since the run began; the stored options are used (%s)", path, "; ".join(edited)
        )
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


def describe(factory, stored: dict | None = None) -> list[str]:
    """One line for each option: name, type, default, the stored value if any, and the field's docstring."""
    kind = dataclass_of(factory)
    if kind is None:
        return []
    docs = _field_docs(kind)
    hints, lines = typing.get_type_hints(kind), []
    for f in dataclasses.fields(kind):
        default = f.default if _has_default(f) else "required"
        now = f", stored {stored[f.name]!r}" if stored and f.name in stored and stored[f.name] != default else ""
        kind_name = getattr(hints[f.name], "__name__", str(hints[f.name]))
        lines.append(f"{f.name}={default!r} ({kind_name}{now}): {docs.get(f.name, '')}".rstrip(": "))
    return lines


def _field_docs(kind) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source (PEP 257's attribute docstrings)."""
    import ast

    try:
        tree = ast.parse(inspect.getsource(kind))
    except (OSError, TypeError):
        return {}
    body, docs = tree.body[0].body, {}
    for node, after in zip(body, body[1:], strict=False):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            if (
                isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def _has_default(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


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
