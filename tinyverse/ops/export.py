"""``export``, ``import``, ``eval --params``: a trained agent as a safetensors file (arrays and a
JSON header), its snapshots along; params named by version or snapshot for eval, export and run."""

import json
import re
from pathlib import Path

import numpy as np

from .. import __version__
from ..database import TOOL_WAIT, connect, masked
from ..database.records import NUMBER, Schema, loads, typed
from ..database.snapshots import LATEST, MAX_SNAPSHOTS, NAME_RE, VERDICT
from ..errors import TinyverseError, command, install
from ..evaluation import chosen
from ..experiment import Experiment
from ..files import written_whole
from ..loader import load_experiment
from ..params import check_params

FORMAT = "tinyverse-params"
MAX_VERSION = 2**62  # a stored version; SQLite's integers end at 2^63-1
SNAPSHOTS = "tinyverse-snapshots/"  # before a snapshot's name and its arrays' names, in the file
SNAPSHOT = Schema({"name": str, "version": int, "time": NUMBER}, {})  # as the metadata lists them


def mode_export(args):
    """Write the params run's verdict kept (else the latest; --params picks), every snapshot and
    the run's options to a safetensors file (no tinyverse needed to load it)."""
    db = connect(args.url, args.prefix, TOOL_WAIT, create=False)
    held = db.snapshots()
    verdict = args.params is None and VERDICT in {s.name for s in held}  # the agent run left
    version, params = chosen(db, VERDICT if verdict else args.params)
    name = Path(args.experiment).stem
    meta = {"format": FORMAT, "tinyverse": __version__, "experiment": name, "version": str(version)}
    meta |= {"options": json.dumps(db.setting("options")), "prefix": db.prefix}
    arrays = dict(params)
    kept = []  # the snapshots written along: any deleted meanwhile is not
    for snapshot in held:
        if (found := db.load_params(snapshot.name)) is not None:
            arrays |= {f"{SNAPSHOTS}{snapshot.name}/{k}": v for k, v in found[1].items()}
            kept.append({"name": snapshot.name, "version": found[0], "time": snapshot.time})
    meta["snapshots"] = json.dumps(kept)
    path = Path(args.output or f"{name}.safetensors")
    st = _safetensors()
    arrays = {k: np.require(v, requirements="C") for k, v in arrays.items()}  # 0-d stays 0-d
    try:
        with written_whole(path) as part:
            st.numpy.save_file(arrays, part, metadata=meta)
    except (ValueError, TypeError) as e:  # a dtype safetensors does not know, such as complex
        raise TinyverseError(f"cannot write params as safetensors ({e})") from None
    except (OSError, st.SafetensorError) as e:  # a folder, no folder, no permission, a full disk
        raise TinyverseError(f"cannot write {path} ({e}): pick another -o") from None
    said = f"wrote {path}: params version {version} of prefix {db.prefix}"
    if verdict:
        said += f" (snapshot {VERDICT}, run's verdict; the newest: --params {LATEST})"
    print(f"{said}; snapshots in it: {len(kept)}")


def mode_import(args):
    """Seed the namespace with the params and options of a file written by export (a warm start,
    or a move)."""
    db = connect(args.url, args.prefix, TOOL_WAIT)
    exp, meta, params = load(args.file, args.experiment, args.options)
    snapshots = snapshots_in(args.file, meta, exp)  # read and checked before anything is written
    stored = db.setting("options")
    options = exp.run.options  # the experiment took the file: its options and shapes fit
    if stored is not None and options is not None and stored != options:
        keys = sorted(stored.keys() | options.keys())
        key = next(k for k in keys if stored.get(k) != options.get(k))
        raise TinyverseError(
            f"{args.file} has option {key}={options.get(key)!r}, prefix {db.prefix} stores "
            f"{key}={stored.get(key)!r}: import into another --prefix"
        )
    if (held := db.params_version()) is not None:
        fix = f"delete them first with {command('clear --del-params', db.prefix)}"
        fix = f"import into another --prefix, or {fix}"
        raise TinyverseError(f"prefix {db.prefix} holds params already (version {held}): {fix}")
    if options is not None:
        db.claim("options", options)
    version = db.save_params(params, min_version=int(meta["version"]), if_absent=True)
    if version is None:
        fix = "import into another --prefix"
        raise TinyverseError(f"a worker stored params in prefix {db.prefix} meanwhile: {fix}")
    for snapshot, arrays in snapshots:
        db.save_snapshot(snapshot["name"], arrays, snapshot["version"])
    where = f"prefix {db.prefix} of {masked(args.url)}"
    said = f"params version {version}, snapshots: {len(snapshots)}"
    print(f"imported {args.file} into {where}: {said}")


def load(path: str, experiment: str, options: dict[str, str]) -> tuple[Experiment, dict, dict]:
    """(experiment holding the params, metadata, params) of a file written by export; ``options``
    over its own."""
    if not Path(path).is_file():
        fix = "pass a .safetensors file written by python -m tinyverse EXP export"
        raise TinyverseError(f"no file {path}: {fix}")
    meta, params = _read(path)
    meta = _checked(path, meta)
    spell = {True: "true", False: "false", None: "none"}  # stored values as --set texts, a user's
    stored = (meta["options"] or {}).items()
    texts = {k: spell[v] if v is None or isinstance(v, bool) else str(v) for k, v in stored}
    texts |= {k: ",".join(map(str, v)) for k, v in stored if isinstance(v, list)}  # local_params
    try:
        exp = load_experiment(experiment, None, {**texts, **options})
        fix = "drop the --set options that change the network"
        check_params(exp.get_params(), params, f"file {path}", fix)
    except TinyverseError as e:
        source = f"{path} (from {meta.get('experiment')})"
        raise TinyverseError(f"{source} does not fit {experiment}: {e}") from None
    exp.set_params(params)
    return exp, meta, params


def snapshots_in(path: str, meta: dict, exp: Experiment) -> list[tuple[dict, dict]]:
    """The snapshots of a file (as :func:`load`'s ``meta`` lists them) with their arrays, checked
    against ``exp``'s params."""
    found = []
    for snapshot in meta["snapshots"]:
        arrays = _read(path, f"{SNAPSHOTS}{snapshot['name']}/")[1]
        where = f"file {path} (snapshot {snapshot['name']})"
        check_params(exp.get_params(), arrays, where, "export it again")
        found.append((snapshot, arrays))
    return found


def _read(path: str, inside: str | None = None) -> tuple[dict, dict]:
    """A file's metadata and arrays: the params (``inside`` None), or those under ``inside``
    (a snapshot's, their names without it); one line if it is no safetensors file."""
    st = _safetensors()

    def kept(key: str) -> bool:
        return key.startswith(inside) if inside else not key.startswith(SNAPSHOTS)

    try:
        with st.safe_open(path, framework="np") as f:
            arrays = {k.removeprefix(inside or ""): f.get_tensor(k) for k in f.keys() if kept(k)}
            return f.metadata() or {}, arrays
    except Exception as e:  # SafetensorError, OSError: the file is not one of ours
        raise TinyverseError(f"{path} is not a safetensors file of tinyverse ({e})") from None


def _checked(path: str, meta: dict[str, str]) -> dict:
    """The file's metadata, its options a dict; a field not as export writes it is one line."""
    if meta.get("format") != FORMAT:
        fix = "export it with tinyverse"
        raise TinyverseError(f"{path} holds no tinyverse params (no {FORMAT} metadata): {fix}")
    version = meta.get("version", "")
    if not re.fullmatch(r"[0-9]{1,19}", version) or int(version) > MAX_VERSION:
        fix = "want a whole number up to 2^62 (room below 2^63 for the next ones): export it again"
        raise TinyverseError(f"{path} has params version {version[:40]!r}: {fix}")
    try:
        options = json.loads(meta.get("options") or "null")
    except ValueError:
        options = ""
    if options is not None and not isinstance(options, dict):
        raise TinyverseError(f"{path} has options that are no JSON object: export it again")
    if (snapshots := _listed(meta.get("snapshots"))) is None:
        raise TinyverseError(f"{path} lists snapshots not as export writes them: export it again")
    return {**meta, "options": options, "snapshots": snapshots}


def _listed(text: str | None) -> list[dict] | None:
    """The snapshots a file's metadata lists (none in a file of an earlier export); None unless
    they are as export writes them."""
    try:
        found = loads(text or "[]")
    except ValueError:
        return None
    if not isinstance(found, list) or len(found) > MAX_SNAPSHOTS:
        return None
    names = [s["name"] for s in found if typed(s, SNAPSHOT) and 1 <= s["version"] <= MAX_VERSION]
    named = all(NAME_RE.fullmatch(name) and name != LATEST for name in names)
    return found if named and len(set(names)) == len(names) == len(found) else None


def a_file(spec: str) -> bool:
    """Whether ``eval --params`` names a file of export's, not params in the database."""
    return Path(spec).is_file() or spec.endswith(".safetensors") or not NAME_RE.fullmatch(spec)


def _safetensors():
    try:
        import safetensors.numpy
    except ImportError:
        needs = f"export and import need safetensors: {install('safetensors')}"
        raise TinyverseError(needs) from None
    return safetensors
