"""The Redis backend's Lua scripts: what must happen in one step on the server, for every reader."""

# KEYS: sessions, seq, lo, meta, namespaces; ARGV: capacity (stored unless one is), prefix, blobs.
# One INCRBY, HSET and HDEL a round (in chunks: Lua's unpack takes a few thousand values), not one
# call a session. A capacity or oldest id set by hand is refused before anything is written; ids far
# below the oldest kept (the count of ids set far ahead by hand) go by one HKEYS, not one by one
ADD = """
local cap = tonumber(redis.call('HGET', KEYS[4], 'capacity') or ARGV[1])
local lo = tonumber(redis.call('GET', KEYS[3]) or '1')
if not (cap and lo and cap >= 1 and cap <= 2^53 and cap % 1 == 0 and lo % 1 == 0) then
  return redis.error_reply('tinyverse: ' .. KEYS[4] .. ' capacity or ' .. KEYS[3] .. ' is junk')
end
redis.call('SADD', KEYS[5], ARGV[2])
redis.call('HSETNX', KEYS[4], 'capacity', ARGV[1])
local n = #ARGV - 2
local id = redis.call('INCRBY', KEYS[2], n)
for s = 0, n - 1, 1000 do
  local fields = {}
  for i = s, math.min(s + 999, n - 1) do
    fields[#fields + 1] = id - n + 1 + i; fields[#fields + 1] = ARGV[3 + i]
  end
  redis.call('HSET', KEYS[1], unpack(fields))
end
lo = math.min(lo, id - n + 1)
if id - cap + 1 - lo > redis.call('HLEN', KEYS[1]) then
  for _, f in ipairs(redis.call('HKEYS', KEYS[1])) do
    if (tonumber(f) or 0) <= id - cap then redis.call('HDEL', KEYS[1], f) end
  end
  lo = id - cap + 1
end
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
redis.call('SET', KEYS[3], (tonumber(redis.call('GET', KEYS[2]) or '0') or 0) + 1)
redis.call('HDEL', KEYS[4], 'layout')
"""
