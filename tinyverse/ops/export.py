"""A trained agent leaves the database: params to a safetensors file and back.

``python -m tinyverse EXP export -o agent.safetensors`` writes the latest params
with the run's options, the experiment's name and the params version as the
file's metadata; ``EXP import agent.safetensors`` seeds a namespace from it (a
warm start, or a run moved between SQLite and Redis); ``EXP eval --params FILE``
plays a file with no database. safetensors holds plain arrays and a JSON header,
never code, so a file from anyone is safe to open; it loads without tinyverse::

    from safetensors.torch import load_file
    params = load_file("agent.safetensors")   # {name: tensor}, as get_params() returned them
"""

import json
import os
from pathlib import Path

import numpy as np

from .. import __version__
from ..database import Database
from ..errors import TinyverseError
from ..experiment import Experiment, load_experiment
from ..params import check_params

FORMAT = "tinyverse-params"


def _safetensors():
    try:
        import safetensors.numpy
    except ImportError:
        raise TinyverseError("export and import need safetensors: pip install 'tinyverse[export]'") from None
    return safetensors


def export(db: Database, experiment: str, path: str) -> int:
    """Write the latest params of ``db`` to ``path`` (whole or not at all); return their version."""
    found = db.load_params()
    if found is None:
        raise TinyverseError(f"no params in prefix {db.prefix} of {db.url} to export: train first, or check --prefix")
    version, params = found
    meta = {"format": FORMAT, "tinyverse": __version__, "experiment": Path(experiment).stem}
    meta |= {"version": str(version), "options": json.dumps(db.setting("options")), "prefix": db.prefix}
    out = Path(path)
    part = out.with_name(f".{out.name}.part")
    try:
        _safetensors().numpy.save_file({k: np.ascontiguousarray(v) for k, v in params.items()}, part, metadata=meta)
        os.replace(part, out)
    except (ValueError, TypeError) as e:  # a dtype safetensors does not know, such as complex
        raise TinyverseError(f"cannot write params as safetensors ({e})") from None
    finally:
        part.unlink(missing_ok=True)
    return version


def read(path: str) -> tuple[dict, dict[str, np.ndarray]]:
    """(metadata, params) of a file written by :func:`export`; one clear error for anything else."""
    st = _safetensors()
    if not Path(path).is_file():
        raise TinyverseError(f"no file {path}: pass a .safetensors file written by python -m tinyverse EXP export")
    try:
        with st.safe_open(path, framework="np") as f:
            meta = f.metadata() or {}
        params = st.numpy.load_file(path)
    except Exception as e:  # SafetensorError, OSError: the file is not one
        raise TinyverseError(f"{path} is not a safetensors file ({e})") from None
    if meta.get("format") != FORMAT or not meta.get("version", "").isdigit():
        raise TinyverseError(f"{path} holds no tinyverse params (no {FORMAT} metadata): export it with tinyverse")
    try:
        meta["options"] = json.loads(meta.get("options") or "null")
    except ValueError:
        raise TinyverseError(f"{path}: its options metadata is not JSON") from None
    return meta, params


def _texts(options: dict | None) -> dict[str, str]:
    """Stored option values as ``--set`` texts, so that the experiment parses them as a user's."""
    spell = {True: "true", False: "false", None: "none"}
    return {k: spell[v] if v is None or isinstance(v, bool) else str(v) for k, v in (options or {}).items()}


def load(path: str, experiment: str, options: dict[str, str]) -> tuple[Experiment, dict, dict]:
    """The experiment with the file's options (``options``, from ``--set``, on top), holding its params."""
    meta, params = read(path)
    try:
        exp = load_experiment(experiment, None, {**_texts(meta["options"]), **options})
        check_params(exp.get_params(), params, f"file {path}", "drop the --set options that change the network")
    except TinyverseError as e:
        raise TinyverseError(f"{path} (from {meta.get('experiment')}) does not fit {experiment}: {e}") from None
    exp.set_params(params)
    return exp, meta, params


def import_into(db: Database, path: str, experiment: str, options: dict[str, str]) -> int:
    """Seed the namespace of ``db`` with the params of ``path`` and its options (``--set`` on top); the version."""
    exp, meta, params = load(path, experiment, options)  # the experiment takes the file: options and shapes fit
    options, stored = exp.options, db.setting("options")
    if stored is not None and options is not None and stored != options:
        key = next(k for k in sorted(stored.keys() | options.keys()) if stored.get(k) != options.get(k))
        raise TinyverseError(
            f"{path} has option {key}={options.get(key)!r}, prefix {db.prefix} stores {key}={stored.get(key)!r}: "
            "import into another --prefix"
        )
    if (held := db.params_version()) is not None:
        raise TinyverseError(
            f"prefix {db.prefix} holds params already (version {held}): import into another --prefix, or delete "
            f"them first with python -m tinyverse {experiment} clear --del-weights --prefix {db.prefix}"
        )
    if options is not None:
        db.claim("options", options)
    version = db.save_params(params, min_version=int(meta["version"]), if_absent=True)
    if version is None:
        raise TinyverseError(f"a worker stored params in prefix {db.prefix} meanwhile: import into another --prefix")
    return version
