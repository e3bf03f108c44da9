"""Workers and what they report: heartbeats, stop requests, metrics. Any machine that can write to the database may
have written any of these, so only well-typed ones are handed out; the others are skipped with a warning."""

import json
import logging
import time
from typing import Any

from ..errors import command
from .backend import Backend, loads, number

log = logging.getLogger(__name__)
METRICS_LIMIT = 100_000  # records kept per metrics kind
STOP_TTL = 600.0  # seconds a stop request waits for its worker
NUMBER = (int, float)
# what readers use of a record, by type: (keys it must hold, keys it may leave out or hold None in)
HEARTBEAT = (
    {"role": str, "host": str, "pid": int, "started": NUMBER},
    {"place": str, "waiting": str, "version": int, "pushes": int, "conflicts": int, "time": NUMBER, "pace": dict}
    | {"steps_per_s": NUMBER, "updates_per_s": NUMBER},
)
PACE = ({"learning_starts": int, "pace_slack": int, "session_length": int}, {"updates_per_step": NUMBER})
METRICS = {
    "episodes": ({"return": NUMBER, "time": NUMBER}, {"steps": int, "worker": str, "version": int}),
    "train": ({}, {"time": NUMBER, "updates": int, "loss": NUMBER, "worker": str, "version": int}),
}


def typed(record: Any, schema: tuple[dict, dict]) -> bool:
    """Whether ``record`` is an object whose keys hold values of their type (:func:`fits`)."""
    required, optional = schema
    if not isinstance(record, dict) or not required.keys() <= record.keys():
        return False
    return all(
        fits(record.get(k), kind) or k in optional and record.get(k) is None
        for k, kind in (optional | required).items()
    )


def fits(value: Any, kind: type | tuple) -> bool:
    """Whether ``value`` is a ``kind``: numbers finite and at most 2^53 in size, never bools; text printable and
    at most 1,000 characters."""
    if isinstance(value, bool) or not isinstance(value, kind):
        return False
    if isinstance(value, str):
        return len(value) <= 1000 and value.isprintable()
    return isinstance(value, dict) or abs(value) <= 2**53


def parsed(text: Any, schema: tuple[dict, ...]) -> dict | None:
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
        """The live workers' heartbeats, with their ``id``; malformed ones are skipped (with a warning)."""
        found = [(worker_id, parsed(text, HEARTBEAT)) for worker_id, text in self._call(self._workers)]
        paced = [(i, b) for i, b in found if b is not None and (b.get("pace") is None or typed(b["pace"], PACE))]
        beats = [{**b, "id": i} for i, b in paced if isinstance(i, str)]
        self._skipped(len(found) - len(beats), "heartbeats", "they expire, or clear --all deletes them")
        return beats

    def remove_worker(self, worker_id: str) -> None:
        """Forget a worker, and any stop request for it."""
        self._call(self._heartbeat, worker_id, None, 0.0)
        self._call(self._set_meta, f"stop:{worker_id}", None, False)

    def request_stop(self, worker_id: str) -> None:
        """Ask a worker (on any machine) to stop at its next heartbeat; ``clear`` keeps the request."""
        self._call(self._set_meta, f"stop:{worker_id}", str(time.time() + STOP_TTL), False)

    def stop_requested(self, worker_id: str) -> bool:
        until = self._call(self._get_meta, f"stop:{worker_id}") or 0
        what = f"the stop request of worker {worker_id!r} in prefix {self.prefix}"
        return number(until, float, what, "the worker deletes it as it leaves: start it again") > time.time()

    def add_metrics(self, kind: str, records: list[dict]) -> None:
        if records:
            self._call(self._add_metrics, kind, [json.dumps(r) for r in records], METRICS_LIMIT)

    def metrics(self, kind: str, last: int = METRICS_LIMIT) -> list[dict]:
        """The newest ``last`` records of a kind, oldest first; malformed ones are skipped (with a warning)."""
        texts = self._call(self._metrics, kind, int(last)) if last > 0 else []  # Redis reads LRANGE -0 -1 as all
        found = [m for m in (parsed(text, METRICS.get(kind, ({}, {}))) for text in texts) if m is not None]
        self._skipped(len(texts) - len(found), f"{kind} metrics", f"{command('clear --del-metrics')} deletes them")
        return found

    def recent_returns(self, last: int = 20, since: float = 0.0) -> list[float]:
        """The returns of the last ``last`` episodes played (those that ended after Unix time ``since``)."""
        return [m["return"] for m in self.metrics("episodes", last) if m["time"] > since]

    def _skipped(self, n: int, what: str, fix: str) -> None:
        if n and self.warn(what):
            log.warning("skipped %d malformed %s in %s (not as tinyverse writes them): %s", n, what, self.prefix, fix)
