"""What the database reads back is typed before use: any machine that can write to the database may
have written anything there. Settings by key, counters and versions as numbers, heartbeats and
metrics by schema; junk is one line naming the fix, or skipped with a warning now and then."""

import contextlib
import json
from typing import Any, NamedTuple

from ..encoding import check_layout
from ..errors import DatabaseError

MAX_JSON = 2**20  # characters of a JSON text read back (a setting, heartbeat, metric): more is junk
# what tinyverse stores under these settings (any other value is refused); other keys: any JSON
KINDS = {"capacity": int, "updates": int, "corrupt": int, "options": dict, "defaults": dict}
KINDS |= {"layout": list, "tunes": int, "tuned": list}
NUMBER = (int, float)
NONE = type(None)


def number(value: Any, kind: type, what: str, fix: str, low: int = 0) -> Any:
    """``value`` (a number, or its text as read back) as ``kind``, int or float, from ``low`` to
    2^53; else one line naming ``what`` and ``fix``. Bools are no numbers, NaN is out of range."""
    if isinstance(value, bytes | str) and len(value) <= 40:
        with contextlib.suppress(ValueError):
            value = kind(value)
    if type(value) in (kind, int) and low <= value <= 2**53:
        return kind(value)
    noun = "whole number" if kind is int else "number"
    raise DatabaseError(f"{what} is {value!r:.40}, not a {noun} in {low}..2^53: {fix}")


def loads(text: Any) -> Any:
    """JSON read back, parsed within bounds; ValueError for anything else."""
    if not isinstance(text, bytes | str) or len(text) > MAX_JSON:
        raise ValueError(f"not JSON text of at most {MAX_JSON:,} characters")
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def checked(key: str, value: Any, what: str, fix: str = "nothing was stored") -> Any:
    """``value`` if it is what tinyverse stores under ``key`` (:data:`KINDS`), else one line."""
    if KINDS.get(key) is int and not isinstance(value, str):  # a count, never its text
        return number(value, int, what, fix, int(key == "capacity"))
    try:
        if key == "layout":
            check_layout(value)
        if isinstance(value, KINDS.get(key, object)):
            return value
    except (TypeError, ValueError):
        pass
    raise DatabaseError(f"{what} is {value!r:.60}, which tinyverse does not store there: {fix}")


class Schema(NamedTuple):
    """What readers use of a record, by type: keys it must hold, keys it may leave out (None is a
    value only where a type names it)."""

    required: dict
    optional: dict


PACE = Schema({"learning_starts": int, "pace_slack": int, "session_length": int}, {})
PACE.required["updates_per_step"] = (*NUMBER, NONE)
HEARTBEAT = Schema({"role": str, "host": str, "pid": int, "started": NUMBER}, {"pace": PACE})
HEARTBEAT.optional.update(place=str, waiting=(str, NONE), version=(int, NONE), time=NUMBER)
HEARTBEAT.optional.update(pushes=int, conflicts=int, steps_per_s=NUMBER, updates_per_s=NUMBER)
EPISODE = Schema({"return": NUMBER, "time": NUMBER, "steps": int}, {"worker": str})
EPISODE.optional["version"] = (int, NONE)  # of the params that played it
EPISODE.optional["opponent"] = str  # a game's
GAME = Schema({"side": str, "opponent": str, "score": NUMBER, "time": NUMBER}, {})  # league.result
METRICS = {  # other kinds: any JSON object
    "episodes": EPISODE,
    "games": GAME,
    "train": Schema({}, {"time": NUMBER, "updates": int, "loss": NUMBER, "worker": str}),
}


def typed(record: Any, schema: Schema) -> bool:
    """Whether ``record`` is an object with the keys it must hold, each value as :func:`fits`."""
    if not isinstance(record, dict) or not schema.required.keys() <= record.keys():
        return False
    kinds = schema.optional | schema.required
    return all(fits(record[key], kinds[key]) for key in kinds.keys() & record.keys())


def fits(value: Any, kind: type | tuple | Schema) -> bool:
    """Whether ``value`` is a ``kind``: numbers finite and at most 2^53 in size, never bools; text
    printable and at most 1,000 characters."""
    if isinstance(kind, Schema):
        return typed(value, kind)
    if isinstance(value, bool) or not isinstance(value, kind):
        return False
    if isinstance(value, str):
        return len(value) <= 1000 and value.isprintable()
    return value is None or abs(value) <= 2**53


def parsed(text: Any, schema: Schema) -> dict | None:
    """The JSON object of ``text`` if it fits ``schema``, else None."""
    try:
        record = loads(text)
    except ValueError:
        return None
    return record if typed(record, schema) else None
