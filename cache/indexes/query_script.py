"""The Lua of a query over a declared index: a range of one shard's entries read in order, with their bodies.

Beside the scripts that keep the entries (``cache.indexes.scripts``, whose
layout it reads); ``cache.indexes.reads`` runs it on every shard a query
reaches and merges the answers.
"""

from __future__ import annotations

from cache.indexes.scripts import ENTRIES_LUA
from cache.redis.script import Script

# KEYS: the shard's spec, the index's entries. ARGV: index name, version,
# min, max (ZRANGEBYLEX bounds), '1' for descending, limit, the bytes of
# bodies and entries this shard may bring, the fields' type letters, the most entries to
# look at. Reads entries in order and, for each whose document still holds
# it (the same script: it matches now), the document's body, while they fit
# the bytes; an entry whose document is gone (expired, or removed outside
# Jetway) is dropped from the index. Returns {state, position, entry, body
# or false, size, ...}: state 'missing' (no such index here), 'building'
# (position: the build's), 'end' (no more entries), 'more' (limit found, or
# a body over the bytes: its entry is last, with false), 'cut' (looked at
# the most entries: position is the last looked at).
QUERY = Script(
    (
        ENTRIES_LUA
        + """
-- The index's state in the shard, without decoding its spec: '1' built, '0' .. position building.
local state = redis.call('HGET', string.sub(KEYS[1], 1, -3) .. 'xst', ARGV[1] .. ':' .. ARGV[2])
if not state then return {'missing', ''} end
if state ~= '1' then return {'building', string.sub(state, 2)} end
local documents = 'jw:' .. string.sub(KEYS[1], 4, -3)
local field = 'x:' .. ARGV[1] .. ':' .. ARGV[2]
local low, high, descending = ARGV[3], ARGV[4], ARGV[5] == '1'
local limit, allowance, kinds, most = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8], tonumber(ARGV[9])
local function id_of(entry)
  local at = 1
  for i = 1, #kinds do
    local kind = string.sub(kinds, i, i)
    if kind == 's' then
      at = select(2, string.find(entry, '\\0\\0', at, true)) + 1
    elseif kind == 'n' then
      at = at + 8
    else
      at = at + 1
    end
  end
  return string.sub(entry, at)
end
local out = {'end', ''}
local found, looked, bytes = 0, 0, 0
while true do
  local chunk
  local want = math.min(limit - found + 8, most - looked)
  if descending then
    chunk = redis.call('ZREVRANGEBYLEX', KEYS[2], high, low, 'LIMIT', 0, want)
  else
    chunk = redis.call('ZRANGEBYLEX', KEYS[2], low, high, 'LIMIT', 0, want)
  end
  if #chunk == 0 then return out end
  for _, entry in ipairs(chunk) do
    looked = looked + 1
    local key = documents .. 'd:' .. id_of(entry)
    local held = redis.call('HMGET', key, field, 'b')
    if holds_entry(field, held[1], entry) then
      local size = #held[2] + #entry  -- the entry comes back too: a long value counts
      found = found + 1
      if bytes + size > allowance then
        out[1], out[2] = 'more', entry
        out[#out + 1], out[#out + 2], out[#out + 3] = entry, false, size
        return out
      end
      bytes = bytes + size
      out[#out + 1], out[#out + 2], out[#out + 3] = entry, held[2], size
      if found >= limit then
        out[1], out[2] = 'more', entry
        return out
      end
    else
      -- Not the document's entry: it expired, was removed or was rewritten outside Jetway's scripts.
      redis.call('ZREM', KEYS[2], entry)
    end
    if looked >= most then
      out[1], out[2] = 'cut', entry
      return out
    end
    if descending then high = '(' .. entry else low = '(' .. entry end
  end
end
"""
    ).encode()
)
