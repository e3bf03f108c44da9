"""Loading a user's experiment file: its module, ``make_experiment(db[, args])`` and the options;
one line a failure."""

import argparse
import dataclasses
import importlib.util
import inspect
import logging
import re
import sys
import types
import typing
from pathlib import Path

from . import declared
from .errors import ExperimentError, install
from .experiment import Experiment
from .options import resolve
from .settings import plain

log = logging.getLogger(__name__)
BOOLS = {"1": True, "true": True, "yes": True, "on": True}
BOOLS |= {"0": False, "false": False, "no": False, "off": False}


def load_experiment(path: str, db=None, options: dict | None = None, tune=True) -> Experiment:
    """The experiment of the file at ``path``: its ``make_experiment`` called with the options
    resolved from ``options`` (and ``db``, if it asks for one); a changed tunable option is stored
    in ``db`` (``tune``) or kept to this process."""
    factory = getattr(import_file(path), "make_experiment", None)
    if not callable(factory):
        fix = "add one that returns a tinyverse.Experiment"
        raise ExperimentError(f"{path} defines no make_experiment(args); {fix}")
    args = None  # the resolved options
    defaults = None  # the file's
    if (kind := dataclass_of(factory)) is not None:
        args, defaults = resolve(kind, path, db, typed(kind, path, options or {}), tune)
    elif options:
        fix = "its make_experiment(args: Args) needs an options dataclass"
        raise ExperimentError(f"{path} takes no options: {fix}")
    try:
        exp = _make(factory, db, args)
    except Exception as e:
        log.debug("make_experiment of %s failed", path, exc_info=True)
        if isinstance(e, TypeError) and (found := re.search(r"abstract methods? (.+)$", str(e))):
            hooks = found[1].replace("'", "")  # Python 3.12 quotes them
            missing = f"{path}: the experiment does not define {hooks}"
            raise ExperimentError(f"{missing}: write them") from None
        failed = f"make_experiment in {path} failed: {type(e).__name__}: {e}"
        raise ExperimentError(f"{failed} (-vv shows where)") from None
    if not isinstance(exp, Experiment):
        returned = f"make_experiment in {path} returned {type(exp).__name__}"
        raise ExperimentError(f"{returned}, not a tinyverse.Experiment")
    if args is not None:  # the run's, read-only to the experiment
        exp.run._args = args  # tuned in place by the workers
        exp.run._options = plain(args)
        exp.run._defaults = defaults
    declared.check(exp)  # before a worker stores the options that set them
    return exp


def _make(factory, db, args) -> Experiment:
    """``make_experiment`` called as it is written: ``(args: Args)``, ``(db, args: Args)``,
    ``(db)`` (an older file's) or ``()``."""
    if args is None:
        return factory(db) if inspect.signature(factory).parameters else factory()
    return factory(args) if dataclass_of(factory, 1) else factory(db, args)


def import_file(path: str):
    """The experiment module, imported from its file as ``python FILE.py`` would (its folder on
    sys.path)."""
    file = Path(path)
    if file.suffix != ".py" or not file.is_file():
        fix = "pass the path of a Python file"
        raise ExperimentError(f"experiment {path} not found or not a .py file: {fix}")
    name = f"tinyverse_experiment_{file.stem}"
    spec = importlib.util.spec_from_file_location(name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    if (folder := str(file.resolve().parent)) not in sys.path:
        sys.path.insert(0, folder)  # the experiment imports its neighbours
    try:
        spec.loader.exec_module(module)
        return module
    except SyntaxError as e:
        problem = f"{path}:{e.lineno}: syntax error: {e.msg}"
    except ImportError as e:
        package = (e.name or "it").split(".")[0]
        problem = f"{path} needs {e.name or e}: install it ({install(package)})"
    except Exception as e:
        log.debug("import of %s failed", path, exc_info=True)
        problem = f"{path} failed to import: {type(e).__name__}: {e}"
    del sys.modules[name]
    raise ExperimentError(problem)


def parse_set(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` from the command line (an argparse type)."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"want NAME=VALUE, got {text!r}")
    name, value = text.split("=", 1)
    return name.strip(), value


def dataclass_of(factory, parameters: int = 2) -> type | None:
    """The options dataclass of ``make_experiment``: the annotation (``Args`` or ``Args | None``)
    of its first or second parameter (of its first ``parameters``), or None."""
    hints = typing.get_type_hints(factory)
    for name in list(inspect.signature(factory).parameters)[:parameters]:
        kinds = typing.get_args(hints.get(name)) or [hints.get(name)]
        found = [k for k in kinds if isinstance(k, type) and dataclasses.is_dataclass(k)]
        if found:
            return found[0]
    return None


def typed(kind: type, path: str, given: dict[str, str]) -> dict:
    """``--set`` texts as values of the options dataclass's fields (bool, int, float, str; "none"
    if optional)."""
    fields = [f.name for f in dataclasses.fields(kind)]
    hints = typing.get_type_hints(kind)
    if unknown := [key for key in given if key not in fields]:
        listed = ", ".join(fields)
        raise ExperimentError(f"{path} has no option {unknown[0]!r}; its options: {listed}")
    return {key: _parse(key, text, hints[key]) for key, text in given.items()}


def _parse(key: str, text: str, hint):
    """``text`` as the field's type: bool, int, float, str or globs (``tuple[str, ...]``,
    comma-separated); "none" for an optional field."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = [k for k in typing.get_args(hint) if k is not type(None)] if union else [hint]
    if union and text.lower() == "none":
        return None
    if kinds == [tuple[str, ...]]:  # globs, comma-separated: a list, as the options are stored
        return [part for part in text.split(",") if part]
    if len(kinds) != 1 or kinds[0] not in (bool, int, float, str):
        fix = "only bool, int, float, str and tuple[str, ...] options can be set"
        raise ExperimentError(f"option {key} has type {hint}: {fix}")
    try:
        return BOOLS[text.lower()] if kinds[0] is bool else kinds[0](text)
    except (KeyError, ValueError):
        raise ExperimentError(f"option {key}={text!r}: not a {kinds[0].__name__}") from None
