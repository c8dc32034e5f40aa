"""The Lua of a write's change-feed event: logged in the write's own script, its stream kept within its caps.

The document scripts (``cache.documents.scripts``) include ``FEED_LUA``
before their writes; ``FEED_ARGS`` is how many of a write's last arguments
are the event's (``cache.feed.streams.FeedLog.script_parts``).
"""

from __future__ import annotations

# A write's event in its shard's change feed (cache.feed.streams), in the
# script of the write itself: no write is stored without its event, and
# no event describes a write that did not happen. Only with a third key
# (the shard's stream); then the last FEED_ARGS of ARGV are the event's
# operation (followed by a space and the writing request's traceparent when
# it was sampled for tracing, logged as the event's c: cache.feed.streams),
# the stream's length cap, its age cap in ms (0: none), the
# channel to nudge, the shard's name and the stream's byte budget. The
# nudge is the shard and the new event's id: a worker that follows the
# collection reads the shard. WRITE_MANY nudges each shard once, after
# its writes, with the last event's id (a follower reads the shard from
# where it was, so the last nudge brings the others' events too): one
# PUBLISH per shard a call, not one per write. In a shard that keeps
# indexes, an event also carries the document's index entries (``marks``,
# cache.indexes.scripts' move_entries and unindex): what a live query judges
# it by (cache.feed.live_queries).
#
# The caps (trim_feed), once a stream has had an event larger than its
# budget's share of one (budget / (length cap + NODE_SLACK), at least
# UNMARKED_BYTES): the oldest events go, exactly, once the stream holds more
# than its budget of bytes (each event counted as event_bytes says: a
# running total and each event's count, oldest first, in
# ji:{<coll>:<shard>}:fb and :fbs, out of the hot cache's tracked prefix),
# more than FEED_STEP events over its length cap, or events older than its
# age cap; never the event just added. A trim goes 1/FEED_STEP below the
# budget, so a write at the cap reads the oldest events once every few
# writes. A stream none of whose events was larger is capped by MAXLEN ~
# alone: its cap bounds its bytes within the budget (Redis trims by whole
# nodes, 100 events by default: fewer than NODE_SLACK more), or within
# UNMARKED_BYTES an event without entries. Counting was most of what a
# feed costs a write (docs/limits.md, "What one write makes Redis hold").
_FEED_LUA = """
-- WRITE_MANY's: by channel (a collection's), each shard's last event, nudged at its end.
local nudges = nil
local function feed_start(K, A)
  if K[3] then return #A - 6 end
  return #A
end
-- What an event counts against its stream's budget: 48, its fields' and values' bytes and one more each, and
-- a quarter more for the allocator (jemalloc's size classes are at most 25 % apart: a 25 KB event's listpack
-- node took 29 KB of MEMORY USAGE).
local function event_bytes(fields)
  local bytes = 48
  for i = 1, #fields do bytes = bytes + #fields[i] + 1 end
  return math.floor(bytes * 5 / 4)
end
-- The counted sizes of the stream's events, oldest first, one a line of `sizes` (a list beside it): trimming
-- reads them, not the events (reading 32 events of 24 entries into Lua was ~10 µs a write, amortized). Made
-- again from the events when it does not match them (the stream was trimmed or deleted outside this script).
local function sizes_of(stream, sizes, length)
  if redis.call('LLEN', sizes) == length then return end
  redis.call('DEL', sizes)
  local start = '-'
  while true do
    local batch = redis.call('XRANGE', stream, start, '+', 'COUNT', 256)
    if #batch == 0 then return end
    local counted = {}
    for i, entry in ipairs(batch) do counted[i] = event_bytes(entry[2]) end
    redis.call('RPUSH', sizes, unpack(counted))
    start = '(' .. batch[#batch][1]
  end
end
local function trim_feed(stream, state, added, max_len, budget, min_ms)
  local sizes = state .. 's'
  local length = redis.call('XLEN', stream)
  local total = redis.call('HINCRBY', state, 'b', added)
  if redis.call('RPUSH', sizes, added) ~= length then
    sizes_of(stream, sizes, length)
    total = 0
    for _, size in ipairs(redis.call('LRANGE', sizes, 0, -1)) do total = total + tonumber(size) end
    redis.call('HSET', state, 'b', total)
  end
  local dropped = 0
  if min_ms then
    local known = tonumber(redis.call('HGET', state, 'o') or '0')
    -- The age cap: the oldest events' ids, one at a time (at most a few a write once the stream is at its age).
    local oldest, start = known, '-'
    while oldest < min_ms and length - dropped > 1 do
      local first = redis.call('XRANGE', stream, start, '+', 'COUNT', 1)[1]
      oldest = tonumber(string.match(first[1], '^%d+'))
      if oldest < min_ms then dropped, start = dropped + 1, '(' .. first[1] end
    end
    if oldest ~= known then redis.call('HSET', state, 'o', oldest) end
  end
  if total <= budget and length < max_len + FEED_STEP and dropped == 0 then return end
  local freed = 0
  if dropped > 0 then
    for _, size in ipairs(redis.call('LRANGE', sizes, 0, dropped - 1)) do freed = freed + tonumber(size) end
  end
  local keep_bytes = total
  if total > budget then keep_bytes = budget - math.floor(budget / FEED_STEP) end
  local keep_len = math.min(length, max_len)
  while length - dropped > 1 and (length - dropped > keep_len or total - freed > keep_bytes) do
    local batch = redis.call('LRANGE', sizes, dropped, dropped + FEED_STEP - 1)
    if #batch == 0 then break end
    for _, size in ipairs(batch) do
      if length - dropped <= 1 or not (length - dropped > keep_len or total - freed > keep_bytes) then break end
      dropped, freed = dropped + 1, freed + tonumber(size)
    end
  end
  if dropped == 0 then return end
  redis.call('XTRIM', stream, 'MAXLEN', length - dropped)
  redis.call('LTRIM', sizes, dropped, -1)
  redis.call('HSET', state, 'b', total - freed)
end
-- WRITE_MANY's: by stream state, whether its events are counted ('b' set): one HEXISTS a call, not one a write.
local counting = nil
local function counted(state)
  if counting and counting[state] ~= nil then return counting[state] end
  local found = redis.call('HEXISTS', state, 'b') == 1
  if counting then counting[state] = found end
  return found
end
local function log_change(K, A, id, etag, marks)
  if not K[3] then return end
  local feed_at = #A - 6
  local op, trace = A[feed_at + 1], nil
  local traced_at = string.find(op, ' ', 1, true)
  if traced_at then op, trace = string.sub(op, 1, traced_at - 1), string.sub(op, traced_at + 1) end
  local fields = {'o', op, 'i', id, 'e', etag}
  if marks then
    for i = 1, #marks do fields[6 + i] = marks[i] end
  end
  if trace then
    fields[#fields + 1] = 'c'
    fields[#fields + 1] = trace
  end
  local state = 'ji:' .. string.sub(K[2], 4, -2) .. 'fb'
  local event
  local bytes, max_len, budget = event_bytes(fields), tonumber(A[feed_at + 2]), tonumber(A[feed_at + 6])
  -- (An event without entries is UNMARKED_BYTES at most, as counted: an expiry's carries its due time, t, and a
  -- sampled write's its traceparent, c, an expiry's ETag being empty and an expiry never traced.)
  if bytes <= math.max(UNMARKED_BYTES, budget / (max_len + NODE_SLACK)) and not counted(state) then
    -- Every event of this stream so far this small: the event cap bounds their bytes, and Redis trims it by whole
    -- nodes as it adds (half the script's cost of counting).
    event = redis.call('XADD', K[3], 'MAXLEN', '~', A[feed_at + 2], '*', unpack(fields))
    if A[feed_at + 3] ~= '0' then
      local oldest = tonumber(string.match(event, '^%d+')) - tonumber(A[feed_at + 3])
      redis.call('XTRIM', K[3], 'MINID', '~', string.format('%d', oldest))
    end
  else
    event = redis.call('XADD', K[3], '*', unpack(fields))
    local min_ms = nil
    if A[feed_at + 3] ~= '0' then
      min_ms = tonumber(string.match(event, '^%d+')) - tonumber(A[feed_at + 3])
    end
    trim_feed(K[3], state, bytes, max_len, budget, min_ms)
    if counting then counting[state] = true end  -- trim_feed's HINCRBY set 'b'
  end
  if nudges then
    local channel = A[feed_at + 4]
    nudges[channel] = nudges[channel] or {}
    nudges[channel][A[feed_at + 5]] = event
  else
    redis.call('PUBLISH', A[feed_at + 4], A[feed_at + 5] .. ' ' .. event)
  end
end
"""
FEED_LUA = _FEED_LUA.replace("FEED_STEP", "32").replace("UNMARKED_BYTES", "392").replace("NODE_SLACK", "132")
FEED_ARGS = 6
