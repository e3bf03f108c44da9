"""Redis backend: many machines share one server.

Sessions live in one hash keyed by id; ``seq`` counts ids handed out and
``lo`` is the oldest id kept, so the stored ids are ``lo..seq``. Appending,
evicting and counting happen in one Lua script, atomic for every reader; a
batch is sampled with one MGET of the range and one HMGET (two round trips beat
one Lua script that copies every blob through Lua: 1.1-1.9x for 32-256 CartPole
sessions). Keys are ``{prefix}:{name}``.
"""

import re
import time

import redis

from ..errors import DatabaseError
from .base import Database

NAMESPACES = "tinyverse:namespaces"
EVERYTHING = {"sessions", "params", "workers", "metrics"}

# append ARGV[3..] and evict beyond the capacity, ARGV[1] stored unless one is; one INCRBY, HSET and HDEL a round
# (in chunks: Lua's unpack takes a few thousand values), not one call a session
ADD = """
redis.call('SADD', KEYS[5], ARGV[2])
local cap = tonumber(redis.call('HGET', KEYS[4], 'capacity'))
if not cap then cap = tonumber(ARGV[1]); redis.call('HSET', KEYS[4], 'capacity', cap) end
local n = #ARGV - 2
local id = tonumber(redis.call('GET', KEYS[2]) or '0')
if n > 0 then
  id = redis.call('INCRBY', KEYS[2], n)
  for s = 0, n - 1, 1000 do
    local fields = {}
    for i = s, math.min(s + 999, n - 1) do fields[#fields + 1] = id - n + 1 + i; fields[#fields + 1] = ARGV[3 + i] end
    redis.call('HSET', KEYS[1], unpack(fields))
  end
end
local lo = tonumber(redis.call('GET', KEYS[3]) or '1')
while id - lo + 1 > cap do
  local gone = {}
  while id - lo + 1 > cap and #gone < 1000 do gone[#gone + 1] = lo; lo = lo + 1 end
  redis.call('HDEL', KEYS[1], unpack(gone))
end
redis.call('SET', KEYS[3], lo)
"""

CLEAR = """
redis.call('UNLINK', KEYS[1])
redis.call('SET', KEYS[3], tonumber(redis.call('GET', KEYS[2]) or '0') + 1)
"""


class RedisDatabase(Database):
    errors = (redis.RedisError,)

    def __init__(self, url: str, prefix: str = "tinyverse", retry_for: float | None = None):
        super().__init__(url, prefix, retry_for)
        url, replica = _replica(url)
        opts = dict(socket_timeout=30, socket_connect_timeout=5, health_check_interval=10)
        self.r = redis.Redis.from_url(url, **opts)
        # params reads (every player's load: the hub's biggest load) from a read replica when the URL names one
        self.reads = self.r if replica is None else redis.Redis.from_url(_at(url, replica), **opts)
        self.k = {n: f"{prefix}:{n}" for n in ("sessions", "seq", "lo", "meta", "params")}
        self.ring = [self.k["sessions"], self.k["seq"], self.k["lo"], self.k["meta"]]
        self.scripts = {n: self.r.register_script(src) for n, src in (("add", ADD), ("clear", CLEAR))}
        self._call(self.r.ping)  # a wrong URL or password shows now, not at the first write
        if self.reads is not self.r:
            self._call(self.reads.ping)

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

    def _save_params(self, blob, min_version, if_absent, expect):
        # WATCH/MULTI rather than a Lua script: a script copies the params (MBs) into a Lua string first
        self.r.sadd(NAMESPACES, self.prefix)  # a namespace is listed once it holds data: sessions or params
        key = self.k["params"]
        with self.r.pipeline() as p:
            while True:
                try:
                    p.watch(key)
                    stored, has = p.hget(key, "version"), p.hexists(key, "data")
                    stored = int(stored or 0)
                    if (if_absent and has) or (expect != -1 and stored != expect):
                        p.unwatch()
                        return None
                    version = max(stored + 1, min_version)
                    p.multi()
                    p.hset(key, mapping={"version": version, "time": time.time(), "data": blob})
                    p.execute()
                    return version
                except redis.WatchError:  # written in between: look again
                    continue

    def _load_params(self):
        version, data = self.reads.hmget(self.k["params"], ["version", "data"])
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
        if self.reads is not self.r:
            self.reads.close()


def _replica(url: str) -> tuple[str, str | None]:
    """The URL without its ``replica=HOST:PORT`` query item, and that item's value (None: none)."""
    base, _, query = url.partition("?")
    items = [q for q in query.split("&") if q]
    found = [q.split("=", 1)[1] for q in items if q.startswith("replica=")]
    rest = [q for q in items if not q.startswith("replica=")]
    if found and not re.fullmatch(r"[^:/@]+:\d+", found[-1]):
        raise DatabaseError(f"bad replica={found[-1]!r} in the Redis URL: use ?replica=HOST:PORT")
    return base + ("?" + "&".join(rest) if rest else ""), (found[-1] if found else None)


def _at(url: str, where: str) -> str:
    """``url`` (credentials, database and options kept) pointing at ``where`` (HOST:PORT)."""
    scheme, rest = url.split("://", 1)
    auth, _, hostpath = rest.rpartition("@")
    path = hostpath[hostpath.index("/") :] if "/" in hostpath else ""
    return f"{scheme}://{auth + '@' if auth else ''}{where}{path}"
