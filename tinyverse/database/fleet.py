"""Workers and what they report: heartbeats, stop requests, metrics. Any machine that can write to
the database may have written any of these: only well-typed ones are handed out, the others are
skipped with a warning now and then."""

import json
import logging
import time
from typing import Any, NamedTuple

from ..errors import command
from .backend import Backend, loads, number

log = logging.getLogger(__name__)
METRICS_LIMIT = 100_000  # records kept per metrics kind
STOP_TTL = 600.0  # seconds a stop request waits for its worker
NUMBER, NONE = (int, float), type(None)


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
METRICS = {  # other kinds: any JSON object
    "episodes": Schema({"return": NUMBER, "time": NUMBER, "steps": int}, {"worker": str}),
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


class Fleet(Backend):
    """Heartbeats, stop requests and metrics of one namespace."""

    def heartbeat(self, worker_id: str, info: dict, ttl: float = 10.0) -> None:
        self._call(self._heartbeat, worker_id, json.dumps(info), float(ttl))

    def workers(self) -> list[dict]:
        """The live workers' heartbeats, with their ``id``; malformed ones skipped (and said)."""
        found = [(i, parsed(text, HEARTBEAT)) for i, text in self._call(self._workers)]
        beats = [{**b, "id": i} for i, b in found if b is not None and isinstance(i, str)]
        self._skipped(len(found) - len(beats), "heartbeats", "they expire, or clear --all deletes")
        return beats

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker, and any stop request for it."""
        self._call(self._heartbeat, worker_id, None, 0.0)
        self._call(self._set_meta, f"stop:{worker_id}", None, False)

    def request_stop(self, worker_id: str) -> None:
        """Ask a worker (on any machine) to stop at its next heartbeat; ``clear`` keeps requests."""
        self._call(self._set_meta, f"stop:{worker_id}", str(time.time() + STOP_TTL), False)

    def stop_requested(self, worker_id: str) -> bool:
        until = self._call(self._get_meta, f"stop:{worker_id}") or 0
        what = f"the stop request of worker {worker_id!r} in prefix {self.prefix}"
        return number(until, float, what, "the worker drops it as it leaves") > time.time()

    def add_metrics(self, kind: str, records: list[dict]) -> None:
        if records:
            self._call(self._add_metrics, kind, [json.dumps(r) for r in records], METRICS_LIMIT)

    def metrics(self, kind: str, last: int = METRICS_LIMIT) -> list[dict]:
        """The newest ``last`` records of a kind, oldest first; malformed ones skipped (said)."""
        texts = self._call(self._metrics, kind, int(last)) if last > 0 else []  # LRANGE -0 -1: all
        schema = METRICS.get(kind, Schema({}, {}))
        found = [m for m in (parsed(t, schema) for t in texts) if m is not None]
        self._skipped(len(texts) - len(found), f"{kind} metrics", command("clear --del-metrics", self.prefix))
        return found

    def recent_returns(self, last: int = 20, since: float = 0.0) -> list[float]:
        """The returns of the last ``last`` episodes played (those that ended after Unix time
        ``since``)."""
        return [m["return"] for m in self.metrics("episodes", last) if m["time"] > since]

    def _skipped(self, n: int, what: str, fix: str) -> None:
        if n and self.warn(what):
            said = "skipped %d malformed %s in %s (not as tinyverse writes them): %s"
            log.warning(said, n, what, self.prefix, fix)
