"""Redis backend: many machines share one server (how it works: docs/database.rst). Keys are
``{prefix}:{name}``."""

import contextlib
import itertools
import random
import re
import time

import redis

from ..errors import DatabaseError
from . import split_replica
from .base import Database
from .lua import ADD, CLEAR
from .records import number

NAMESPACES = "tinyverse:namespaces"
ANSWER_WAIT = 30.0  # seconds a worker's command waits for an answer till it says so and waits on
SCANNED = {"workers": "worker:*", "metrics": "metrics:*", "params": "snapshot:*"}  # clear scans
TYPES = {"sessions": b"hash", "seq": b"string", "lo": b"string", "meta": b"hash", "params": b"hash"}


class RedisDatabase(Database):
    errors = (redis.RedisError,)

    def __init__(self, url: str, prefix: str = "tinyverse", retry_for: float | None = None):
        super().__init__(url, prefix, retry_for)
        url, replica = split_replica(url)
        timeout = ANSWER_WAIT if retry_for is None else max(1.0, min(retry_for, 5.0))  # tools: soon
        opts = dict(socket_timeout=timeout, socket_connect_timeout=5, health_check_interval=10)
        opts["retry"] = redis.retry.Retry(redis.backoff.NoBackoff(), 0)  # _call alone retries
        self.r = redis.Redis.from_url(url, **opts)
        # params reads (every player's: the hub's biggest load) from a replica if the URL names one
        self.reads = self.r if replica is None else redis.Redis.from_url(replica, **opts)
        self.k = {n: f"{prefix}:{n}" for n in ("sessions", "seq", "lo", "meta", "params")}
        self.ring = [self.k["sessions"], self.k["seq"], self.k["lo"], self.k["meta"]]
        self.seen = (1, 0, 0)  # the stored ids' range the last sample read, and its growth then
        self.scripts = {"add": self.r.register_script(ADD), "clear": self.r.register_script(CLEAR)}
        for client in {self.r, self.reads}:
            self._call(client.ping)  # a wrong URL or password shows now, not at the first write

    def _is_transient(self, e):
        if isinstance(e, redis.AuthenticationError):  # a wrong password does not get better
            fix = "check --password or the URL"
            raise DatabaseError(f"Redis at {self.url} refused the password ({e}): {fix}")
        if "SSL" in str(e):  # nor does a certificate that does not verify
            fix = "pass the CA that signed the server's certificate: --tls-ca FILE (or "
            fix += "?ssl_ca_certs=FILE in the URL)"
            failed = f"TLS with Redis at {self.url} failed ({str(e).split('] ')[-1]})"
            raise DatabaseError(f"{failed}: {fix}")
        loading = isinstance(e, redis.ResponseError) and str(e).startswith("LOADING")
        return loading or isinstance(e, (redis.ConnectionError, redis.TimeoutError))

    def _failure(self, error):
        """Junk in our keys (another type, text for a number) is named, with the fix."""
        if not re.search(r"WRONGTYPE|not an integer|not a valid float|^tinyverse: ", str(error)):
            return super()._failure(error)
        with contextlib.suppress(redis.RedisError):  # the server may be gone by now
            wrong = [f"{key} holds a {kind.decode()}" for key, kind in self._wrong_types()]
            error = ", ".join(wrong) or error
        return f"Redis at {self.url}: {str(error).removeprefix('tinyverse: ')}: {self.junk}"

    def _wrong_types(self) -> list[tuple[str, bytes]]:
        """Our keys (this prefix's, the list of prefixes) of another type than tinyverse's."""
        want = {self.k[name]: kind for name, kind in TYPES.items()} | {NAMESPACES: b"set"}
        for pattern, kind in (("metrics:*", b"list"), ("snapshot:*", b"hash")):  # clear scans them
            keys = self.r.scan_iter(match=f"{self.prefix}:{pattern}", count=1000)
            want |= {key.decode(errors="replace"): kind for key in keys}
        found = {key: self.r.type(key) for key in want}  # a call a key: only after an error
        return [(key, kind) for key, kind in found.items() if kind not in (b"none", want[key])]

    def _add(self, blobs, capacity):
        self.scripts["add"](keys=[*self.ring, NAMESPACES], args=[capacity, self.prefix, *blobs])

    def _get(self, ids):
        found = self.r.hmget(self.k["sessions"], ids)
        return {i: b for i, b in zip(ids, found, strict=True) if b is not None}

    def _delete(self, ids):
        return self.r.hdel(self.k["sessions"], *ids)

    def _range(self):
        lo, hi = self._bounds(self.r.mget(self.k["lo"], self.k["seq"]))
        return lo, hi, hi

    def _bounds(self, found: list) -> tuple[int, int]:
        """The stored ids' range from lo and seq as read; one line if they are junk."""
        hi = number(found[1] or 0, int, self.k["seq"], self.junk)
        return number(found[0] or 1, int, self.k["lo"], self.junk), hi

    def _sample(self, n):
        # one round trip, uniform over the ids stored now (how: docs/database.rst, Redis)
        lo, hi, grew = self.seen
        top = max(hi + 2 * grew, lo)  # one id at least: an HMGET of none is an error
        drawn = random.choices(range(lo, top + 1), k=n)
        with self.r.pipeline(transaction=False) as p:
            p.mget(self.k["lo"], self.k["seq"]).hmget(self.k["sessions"], drawn)
            now, found = p.execute()
        now_lo, now_hi = self._bounds(now)
        self.seen = (now_lo, now_hi, now_hi - hi if lo <= hi <= now_hi else 0)
        if now_hi < now_lo or now_lo < lo or now_hi > top:  # none stored; not all drawn from
            return None if now_hi < now_lo else []
        rows = zip(drawn, found, strict=True)
        return [(i, blob) for i, blob in rows if blob is not None and now_lo <= i <= now_hi]

    def _set_meta(self, key, value, if_absent):
        if value is None:
            self.r.hdel(self.k["meta"], key)
        else:
            (self.r.hsetnx if if_absent else self.r.hset)(self.k["meta"], key, value)

    def _get_meta(self, key):
        return self.r.hget(self.k["meta"], key)

    def _incr_meta(self, key, n):
        try:
            return self.r.hincrby(self.k["meta"], key, n)
        except redis.ResponseError as e:  # not an integer, or one that would overflow: junk
            raise DatabaseError(f"{self.k['meta']} field {key!r} ({e}): {self.junk}") from None

    def _save_params(self, blob, version, name=None):
        self.r.sadd(NAMESPACES, self.prefix)  # a namespace is listed once it holds data
        key = self._params_key(name)

        def write(p):  # WATCH/MULTI, retried if the params change meanwhile (Lua would copy MBs)
            stored = self._saved(p.hget(key, "version") or 0, 0, name)[0]
            if (new := version(stored)) is not None:
                p.multi()
                p.hset(key, mapping={"version": new, "time": time.time(), "data": blob})
            return new

        return self.r.transaction(write, key, value_from_callable=True)

    def _params(self, data, name=None):
        fields = ["version", "time", "data"] if data else ["version", "time"]
        found = (self.reads if data else self.r).hmget(self._params_key(name), fields)
        return None if found[0] is None else (*self._saved(*found[:2], name), *found[2:])

    def _params_key(self, name: str | None) -> str:
        """The hash of the rolling params (``name`` None), or of the snapshot ``name``."""
        return self.k["params"] if name is None else f"{self.prefix}:snapshot:{name}"

    def _snapshots(self, limit):
        scan = self.r.scan_iter(match=self._params_key("*"), count=1000)
        keys = list(itertools.islice(scan, limit))
        with self.r.pipeline(transaction=False) as p:
            for key in keys:
                p.hmget(key, "version", "time")
            found = p.execute()
        names = [key.decode(errors="replace")[len(self.prefix) + 10 :] for key in keys]
        return [(n, *f) for n, f in zip(names, found, strict=True) if f[0] is not None]

    def _delete_snapshot(self, name):
        return self.r.delete(self._params_key(name)) > 0

    def _heartbeat(self, worker_id, info, ttl):
        if info is None:
            self.r.delete(f"{self.prefix}:worker:{worker_id}")
        else:
            self.r.set(f"{self.prefix}:worker:{worker_id}", info, px=int(ttl * 1000))

    def _workers(self):
        keys = sorted(self.r.scan_iter(match=f"{self.prefix}:worker:*", count=1000))
        ids = [key.decode(errors="replace")[len(self.prefix) + 8 :] for key in keys]
        beats = self.r.mget(keys) if keys else []
        return [(i, beat) for i, beat in zip(ids, beats, strict=True) if beat is not None]

    def _add_metrics(self, kind, records, limit):
        key = f"{self.prefix}:metrics:{kind}"
        with self.r.pipeline(transaction=True) as p:
            p.rpush(key, *records).ltrim(key, -limit, -1).execute()

    def _metrics(self, kind, last):
        return self.r.lrange(f"{self.prefix}:metrics:{kind}", -last, -1)

    def _clear(self, what):
        if "settings" in what and (junk := [key for key, _ in self._wrong_types()]):
            self.r.unlink(*junk)  # of another type: gone whole, so the rest can run
        if "sessions" in what:  # and their layout; seq (sessions ever added) stays
            self.scripts["clear"](keys=self.ring)
        keys = [self.k["params"]] if "params" in what else []
        for name, pattern in SCANNED.items():
            if name in what:
                keys += self.r.scan_iter(match=f"{self.prefix}:{pattern}", count=1000)
        if "settings" in what:  # and the counters, and the namespace's name; stop requests stay
            keys += [self.k["seq"], self.k["lo"]]
            if settings := [k for k in self.r.hkeys(self.k["meta"]) if not k.startswith(b"stop:")]:
                self.r.hdel(self.k["meta"], *settings)
            self.r.srem(NAMESPACES, self.prefix)
        if keys:
            self.r.unlink(*keys)

    def _namespaces(self):
        return [p.decode(errors="replace") for p in self.r.smembers(NAMESPACES)]

    def close(self):
        for client in {self.r, self.reads}:
            client.close()
