"""The database's control plane: what runs the fleet rather than the learning. Settings (the run's
options, the sessions' layout, the capacity), counters, workers' heartbeats and stop requests,
metrics, and clearing a namespace. What it reads back is typed first (:mod:`.records`)."""

import json
import logging
import time
from typing import Any

from ..errors import DatabaseError, command
from .backend import PREFIX_RE, Backend
from .records import HEARTBEAT, METRICS, Schema, checked, loads, number, parsed

log = logging.getLogger(__name__)
METRICS_LIMIT = 100_000  # records kept per metrics kind
STOP_TTL = 600.0  # seconds a stop request waits for its worker


class Control(Backend):
    """Settings, counters, workers, stop requests and metrics of one namespace."""

    layout: list | None = None  # the sessions' (a setting), as the data plane last read it

    # -- settings and counters ---------------------------------------------------------------------
    def claim(self, key: str, value: Any) -> Any:
        """Store ``value`` (as JSON) under ``key`` unless one is stored; return the stored one."""
        value = checked(key, value, f"setting {key!r} to store")  # before it is stored, not after
        self._call(self._set_meta, key, json.dumps(value), True)
        return self.setting(key)

    def put(self, key: str, value: Any) -> None:
        """Store ``value`` (as JSON) under ``key``, over any stored one (a tuned option)."""
        value = checked(key, value, f"setting {key!r} to store")
        self._call(self._set_meta, key, json.dumps(value), False)

    def setting(self, key: str) -> Any:
        """The JSON value :meth:`claim` stored under ``key``, or None; one line if it is junk."""
        what = f"setting {key!r} of prefix {self.prefix}"
        try:
            text = self._call(self._get_meta, key)
            return None if text is None else checked(key, loads(text), what, self.junk)
        except ValueError:
            raise DatabaseError(f"{what} is not JSON: {self.junk}") from None

    def set_capacity(self, capacity: int) -> None:
        """Keep at most ``capacity`` sessions from now on, for every worker, evicting the oldest
        now (``--buffer-size``; else the first append stores one: :meth:`add_sessions`)."""
        capacity = checked("capacity", capacity, "buffer size")
        if (old := self.capacity()) not in (None, capacity):
            said = "buffer size of %s: %d sessions, was %d (for every worker)"
            log.warning(said, self.prefix, capacity, old)
        self._call(self._set_meta, "capacity", str(capacity), False)
        self._call(self._add, [], capacity)  # an append of nothing evicts

    def capacity(self) -> int | None:
        return self.setting("capacity")

    def add_to_counter(self, name: str, n: int) -> int:
        """Add ``n`` to a counter (the pace's "updates", "corrupt" records removed); the total."""
        total = self._call(self._incr_meta, name, int(n))
        return number(total, int, f"counter {name!r} of prefix {self.prefix}", self.junk)

    def counter(self, name: str) -> int:
        return self.setting(name) or 0

    # -- workers -----------------------------------------------------------------------------------
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

    # -- metrics -----------------------------------------------------------------------------------
    def add_metrics(self, kind: str, records: list[dict]) -> None:
        if records:
            texts = [json.dumps(r) for r in records]
            self._call(self._add_metrics, kind, texts, METRICS_LIMIT)

    def metrics(self, kind: str, last: int = METRICS_LIMIT) -> list[dict]:
        """The newest ``last`` records of a kind, oldest first; malformed ones skipped (said)."""
        texts = self._call(self._metrics, kind, int(last)) if last > 0 else []  # LRANGE -0 -1: all
        schema = METRICS.get(kind, Schema({}, {}))
        found = [m for m in (parsed(t, schema) for t in texts) if m is not None]
        fix = command("clear --del-metrics", self.prefix)
        self._skipped(len(texts) - len(found), f"{kind} metrics", fix)
        return found

    def recent_returns(self, last: int = 20, since: float = 0.0) -> list[float]:
        """The returns of the last ``last`` episodes played (those that ended after Unix time
        ``since``)."""
        return [m["return"] for m in self.metrics("episodes", last) if m["time"] > since]

    def _skipped(self, n: int, what: str, fix: str) -> None:
        if n and self.warn(what):
            said = "skipped %d malformed %s in %s (not as tinyverse writes them): %s"
            log.warning(said, n, what, self.prefix, fix)

    # -- namespaces --------------------------------------------------------------------------------
    def namespaces(self) -> list[str]:
        """Prefixes used in this database (some may hold no data: check before listing them)."""
        found = self._call(self._namespaces)
        return sorted(p for p in found if isinstance(p, str) and PREFIX_RE.fullmatch(p))  # not junk

    def clear(self, sessions=False, params=False, workers=False, metrics=False) -> None:
        """Delete what is asked; sessions take their layout along, everything takes the settings
        and counters too (stop requests stay)."""
        what = {k for k, v in locals().items() if v is True}
        if len(what) == 4:  # a fresh start
            what.add("settings")
        self._call(self._clear, what)
        self.layout = None
