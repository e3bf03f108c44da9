"""Redis backend: many machines share one server (how it works: docs/database.rst). Keys are ``{prefix}:{name}``."""

import re
import time
from urllib.parse import urlsplit

import redis

from ..errors import DatabaseError
from .base import Database

NAMESPACES = "tinyverse:namespaces"

# KEYS: sessions, seq, lo, meta, namespaces; ARGV: capacity (stored unless one is), prefix, sessions. One INCRBY,
# HSET and HDEL a round (in chunks: Lua's unpack takes a few thousand values), not one call a session
ADD = """
redis.call('SADD', KEYS[5], ARGV[2])
local cap = tonumber(redis.call('HGET', KEYS[4], 'capacity'))
if not cap then cap = tonumber(ARGV[1]); redis.call('HSET', KEYS[4], 'capacity', cap) end
local n = #ARGV - 2
local id = redis.call('INCRBY', KEYS[2], n)
for s = 0, n - 1, 1000 do
  local fields = {}
  for i = s, math.min(s + 999, n - 1) do fields[#fields + 1] = id - n + 1 + i; fields[#fields + 1] = ARGV[3 + i] end
  redis.call('HSET', KEYS[1], unpack(fields))
end
local lo = tonumber(redis.call('GET', KEYS[3]) or '1')
while id - lo + 1 > cap do
  local gone = {}
  while id - lo + 1 > cap and #gone < 1000 do gone[#gone + 1] = lo; lo = lo + 1 end
  redis.call('HDEL', KEYS[1], unpack(gone))
end
redis.call('SET', KEYS[3], lo)
"""

# KEYS: sessions, seq, lo, meta. One script: an append racing a GET of seq went uncounted
CLEAR = """
redis.call('UNLINK', KEYS[1])
redis.call('SET', KEYS[3], tonumber(redis.call('GET', KEYS[2]) or '0') + 1)
redis.call('HDEL', KEYS[4], 'layout')
"""


class RedisDatabase(Database):
    errors = (redis.RedisError,)

    def __init__(self, url: str, prefix: str = "tinyverse", retry_for: float | None = None):
        super().__init__(url, prefix, retry_for)
        url, replica = _replica(url)
        opts = dict(socket_timeout=30, socket_connect_timeout=5, health_check_interval=10)
        self.r = redis.Redis.from_url(url, **opts)
        # params reads (every player's load: the hub's biggest load) from a read replica when the URL names one
        self.reads = self.r if replica is None else redis.Redis.from_url(replica, **opts)
        self.k = {n: f"{prefix}:{n}" for n in ("sessions", "seq", "lo", "meta", "params")}
        self.ring = [self.k["sessions"], self.k["seq"], self.k["lo"], self.k["meta"]]
        self.scripts = {n: self.r.register_script(src) for n, src in (("add", ADD), ("clear", CLEAR))}
        for client in {self.r, self.reads}:
            self._call(client.ping)  # a wrong URL or password shows now, not at the first write

    def _is_transient(self, e):
        if isinstance(e, redis.AuthenticationError):  # a wrong password does not get better with time
            raise DatabaseError(f"Redis at {self.url} refused the password ({e}): check --password or the URL")
        if "SSL" in str(e):  # nor does a certificate that does not verify
            fix = "pass the CA that signed the server's certificate: --tls-ca FILE (or ?ssl_ca_certs=FILE in the URL)"
            raise DatabaseError(f"TLS with Redis at {self.url} failed ({str(e).split('] ')[-1]}): {fix}")
        loading = isinstance(e, redis.ResponseError) and str(e).startswith("LOADING")
        return loading or isinstance(e, (redis.ConnectionError, redis.TimeoutError))

    def _add(self, blobs, capacity):
        self.scripts["add"](keys=[*self.ring, NAMESPACES], args=[capacity, self.prefix, *blobs])

    def _get(self, ids):
        return {i: b for i, b in zip(ids, self.r.hmget(self.k["sessions"], ids), strict=True) if b is not None}

    def _delete(self, ids):
        return self.r.hdel(self.k["sessions"], *ids)

    def _range(self):
        lo, hi = self.r.mget(self.k["lo"], self.k["seq"])
        return int(lo or 1), int(hi or 0), int(hi or 0)

    def _set_meta(self, key, value, if_absent):
        if value is None:
            self.r.hdel(self.k["meta"], key)
        else:
            (self.r.hsetnx if if_absent else self.r.hset)(self.k["meta"], key, value)

    def _get_meta(self, key):
        value = self.r.hget(self.k["meta"], key)
        return None if value is None else value.decode()

    def _incr_meta(self, key, n):
        return self.r.hincrby(self.k["meta"], key, n)

    def _save_params(self, blob, version):
        self.r.sadd(NAMESPACES, self.prefix)  # a namespace is listed once it holds data: sessions or params

        def write(p):  # WATCH/MULTI, retried if the params change in between (a Lua script would copy MBs)
            stored = p.hget(self.k["params"], "version")
            if (new := version(int(stored or 0))) is not None:
                p.multi()
                p.hset(self.k["params"], mapping={"version": new, "time": time.time(), "data": blob})
            return new

        return self.r.transaction(write, self.k["params"], value_from_callable=True)

    def _params(self, data):
        fields = ["version", "time", "data"] if data else ["version", "time"]
        found = (self.reads if data else self.r).hmget(self.k["params"], fields)
        return None if found[0] is None else (int(found[0]), float(found[1]), *found[2:])

    def _heartbeat(self, worker_id, info, ttl):
        if info is None:
            self.r.delete(f"{self.prefix}:worker:{worker_id}")
        else:
            self.r.set(f"{self.prefix}:worker:{worker_id}", info, px=int(ttl * 1000))

    def _workers(self):
        keys = sorted(self.r.scan_iter(match=f"{self.prefix}:worker:*", count=1000))
        return [v.decode() for v in self.r.mget(keys) if v is not None] if keys else []

    def _add_metrics(self, kind, records, limit):
        key = f"{self.prefix}:metrics:{kind}"
        with self.r.pipeline(transaction=True) as p:
            p.rpush(key, *records).ltrim(key, -limit, -1).execute()

    def _metrics(self, kind, last):
        return [v.decode() for v in self.r.lrange(f"{self.prefix}:metrics:{kind}", -last, -1)]

    def _clear(self, what):
        if "sessions" in what:  # and their layout; keep seq (sessions ever added), start the ring after it
            self.scripts["clear"](keys=self.ring)
        keys = [self.k["params"]] if "params" in what else []
        for name, pattern in (("workers", "worker:*"), ("metrics", "metrics:*")):
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
        return [p.decode() for p in self.r.smembers(NAMESPACES)]

    def close(self):
        for client in {self.r, self.reads}:
            client.close()


def _replica(url: str) -> tuple[str, str | None]:
    """The URL without its ``replica=HOST:PORT`` query item, and that URL pointed at the replica (None: none named)."""
    parts = urlsplit(url)
    items = [q for q in parts.query.split("&") if q]
    named = [q.removeprefix("replica=") for q in items if q.startswith("replica=")]
    if not named:
        return url, None
    if not re.fullmatch(r"[^:/@]+:\d+", named[-1]):
        raise DatabaseError(f"bad replica={named[-1]!r} in the Redis URL: use ?replica=HOST:PORT")
    primary = parts._replace(query="&".join(q for q in items if not q.startswith("replica=")))
    auth = parts.netloc.rpartition("@")[0]
    return primary.geturl(), primary._replace(netloc=f"{auth}@{named[-1]}" if auth else named[-1]).geturl()
