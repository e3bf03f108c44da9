"""Redis backend: many machines share one server.

Sessions live in one hash keyed by id; ``seq`` counts ids handed out and
``lo`` is the oldest id kept, so the stored ids are ``lo..seq``. Appending,
evicting and counting happen in one Lua script, atomic for every reader; a
batch is sampled with one MGET of the range and one HMGET (two round trips beat
one Lua script that copies every blob through Lua: 1.1-1.9x for 32-256 CartPole
sessions). Keys are ``{prefix}:{name}``.
"""

import time

import redis

from ..errors import DatabaseError
from .base import Database

NAMESPACES = "tinyverse:namespaces"
EVERYTHING = {"sessions", "params", "workers", "metrics"}

# append ARGV[4..] and evict beyond the capacity, stored unless one is (or ARGV[3] == '1': set it)
ADD = """
redis.call('SADD', KEYS[5], ARGV[2])
local cap = tonumber(redis.call('HGET', KEYS[4], 'capacity'))
if ARGV[3] == '1' or not cap then cap = tonumber(ARGV[1]); redis.call('HSET', KEYS[4], 'capacity', cap) end
for i = 4, #ARGV do redis.call('HSET', KEYS[1], redis.call('INCR', KEYS[2]), ARGV[i]) end
local id = tonumber(redis.call('GET', KEYS[2]) or '0')
local lo = tonumber(redis.call('GET', KEYS[3]) or '1')
while id - lo + 1 > cap do redis.call('HDEL', KEYS[1], lo); lo = lo + 1 end
redis.call('SET', KEYS[3], lo)
"""

CLEAR = """
redis.call('UNLINK', KEYS[1])
redis.call('SET', KEYS[3], tonumber(redis.call('GET', KEYS[2]) or '0') + 1)
"""

SAVE_PARAMS = """
if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[1], 'data') == 1 then return false end
local stored = tonumber(redis.call('HGET', KEYS[1], 'version') or '0')
if ARGV[5] ~= '-1' and stored ~= tonumber(ARGV[5]) then return false end
local v = math.max(stored + 1, tonumber(ARGV[2]))
redis.call('HSET', KEYS[1], 'version', v, 'time', ARGV[4], 'data', ARGV[1])
return v
"""


class RedisDatabase(Database):
    def __init__(self, url: str, prefix: str = "tinyverse", retry_for: float | None = None):
        super().__init__(url, prefix, retry_for)
        self.r = redis.Redis.from_url(url, socket_timeout=30, socket_connect_timeout=5, health_check_interval=10)
        self.k = {n: f"{prefix}:{n}" for n in ("sessions", "seq", "lo", "meta", "params")}
        self.ring = [self.k["sessions"], self.k["seq"], self.k["lo"], self.k["meta"]]
        self.scripts = {
            n: self.r.register_script(src) for n, src in (("add", ADD), ("params", SAVE_PARAMS), ("clear", CLEAR))
        }
        self._call(self.r.ping)  # a wrong URL or password shows now, not at the first write

    def _is_transient(self, e):
        if isinstance(e, redis.AuthenticationError):  # a wrong password does not get better with time
            raise DatabaseError(f"Redis at {self.url} refused the password ({e}): check --password or the URL")
        if "SSL" in str(e):  # nor does a certificate that does not verify
            raise DatabaseError(
                f"TLS with Redis at {self.url} failed ({str(e).split('] ')[-1]}): pass the CA that signed the "
                "server's certificate with --tls-ca FILE (or ?ssl_ca_certs=FILE in the URL)"
            )
        return isinstance(e, (redis.ConnectionError, redis.TimeoutError)) or (
            isinstance(e, redis.ResponseError) and str(e).startswith("LOADING")
        )

    def _add(self, blobs, capacity):
        self.scripts["add"](keys=[*self.ring, NAMESPACES], args=[capacity, self.prefix, 0, *blobs])

    def _get(self, ids):
        return {i: b for i, b in zip(ids, self.r.hmget(self.k["sessions"], ids), strict=True) if b is not None}

    def _delete(self, ids):
        return self.r.hdel(self.k["sessions"], *ids)

    def _range(self) -> tuple[int, int]:
        lo, hi = self.r.mget(self.k["lo"], self.k["seq"])
        return int(lo or 1), int(hi or 0)

    def _count(self):
        lo, hi = self._range()
        return max(hi - lo + 1, 0), hi

    def _set_meta(self, key, value, if_absent):
        if value is None:
            self.r.hdel(self.k["meta"], key)
        elif key == "capacity" and not if_absent:
            self.scripts["add"](keys=[*self.ring, NAMESPACES], args=[value, self.prefix, 1])
        else:
            (self.r.hsetnx if if_absent else self.r.hset)(self.k["meta"], key, value)

    def _get_meta(self, key):
        value = self.r.hget(self.k["meta"], key)
        return None if value is None else value.decode()

    def _incr_meta(self, key, n):
        return self.r.hincrby(self.k["meta"], key, n)

    def _save_params(self, blob, min_version, if_absent, expect):
        self.r.sadd(NAMESPACES, self.prefix)  # a namespace is listed once it holds data: sessions or params
        return self.scripts["params"](
            keys=[self.k["params"]], args=[blob, min_version, int(if_absent), time.time(), expect]
        )

    def _load_params(self):
        version, data = self.r.hmget(self.k["params"], ["version", "data"])
        return None if data is None else (int(version), data)

    def _params_version(self):
        version, saved = self.r.hmget(self.k["params"], ["version", "time"])
        return None if version is None else (int(version), float(saved))

    def _heartbeat(self, worker_id, info, ttl):
        self.r.set(f"{self.prefix}:worker:{worker_id}", info, px=int(ttl * 1000))

    def _workers(self):
        keys = sorted(self.r.scan_iter(match=f"{self.prefix}:worker:*", count=1000))
        return [v.decode() for v in self.r.mget(keys) if v is not None] if keys else []

    def _remove_worker(self, worker_id):
        self.r.delete(f"{self.prefix}:worker:{worker_id}")

    def _add_metrics(self, kind, records, limit):
        key = f"{self.prefix}:metrics:{kind}"
        with self.r.pipeline(transaction=True) as p:
            p.rpush(key, *records).ltrim(key, -limit, -1).execute()

    def _metrics(self, kind, last):
        return [v.decode() for v in self.r.lrange(f"{self.prefix}:metrics:{kind}", -last, -1)]

    def _clear(self, what):
        keys = []
        if "sessions" in what:  # keep seq (sessions ever added); start the ring after it
            self.scripts["clear"](keys=self.ring[:3])  # one script: an append racing a GET of seq went uncounted
            self.r.hdel(self.k["meta"], "layout")
        if "params" in what:
            keys.append(self.k["params"])
        for name, pattern in (("workers", "worker:*"), ("metrics", "metrics:*")):
            if name in what:
                keys += self.r.scan_iter(match=f"{self.prefix}:{pattern}", count=1000)
        if what >= EVERYTHING:  # a fresh start: counters, settings and the name go; stop requests stay
            keys += [self.k["seq"], self.k["lo"]]
            settings = [k for k in self.r.hkeys(self.k["meta"]) if not k.startswith(b"stop:")]
            if settings:
                self.r.hdel(self.k["meta"], *settings)
            self.r.srem(NAMESPACES, self.prefix)
        if keys:
            self.r.unlink(*keys)

    def _namespaces(self):
        return [p.decode() for p in self.r.smembers(NAMESPACES)]

    def close(self):
        self.r.close()
