"""The Lua that makes a document's expiry a change like a delete: its entries leave, its event is logged.

Redis deletes an expired hash on its own (docs/design/expiry.md, "What Redis
does"), and once it is gone nothing says which index entries were its: an
entry lives in the index's sorted set and in the hash's ``x:`` field only.
So, for every document with a TTL, the write scripts keep beside the shard
(``cache.keys``, all under the shard's hash tag):

    ji:{<coll>:<shard>}:xe    ZSET  id -> its hash's expiry in ms (PEXPIRETIME)
    ji:{<coll>:<shard>}:xm    HASH  id -> cmsgpack of its x:<name>:<v>, entry pairs
                                    (only in a shard that keeps indexes)

Invariant I: every document hash with a TTL has its id in ``xe`` scored with
its ``PEXPIRETIME``, and ``xm`` holds its entries in the indexes the shard
lists; an id in ``xe`` without a hash is an expiry not carried out yet. Every
script that sets or clears a TTL or changes an entry keeps I in the same
script (``cache.documents.scripts``: put, delete; ``cache.indexes.scripts``:
BUILD), and Redis deletes a hash only at or after its ``PEXPIRETIME``.

``expire_one`` carries out one expiry: the mirrored entries leave their
indexes, the id leaves the shard's id index and ``xe``/``xm``, and the feed
gets ``op: expire`` with a delete's marks (``w:<name>:<v>``), so a live query
the document matched is told ``matches: false``. ``expire_due`` does it for
a shard's due ids, a step at a time: the sweeper's script
(``cache.documents.expiry``), and the fragment a script that must not count an
expired document runs first (``cache.documents.scripts.EXPIRE_DUE_LUA``).

These fragments need ``entries_of`` (``ENTRIES_LUA``), ``index_tag``
(``WRITE_LUA``) and ``log_change`` (``cache.feed.feed_lua``) defined
before them; ``MIRROR_LUA`` (the build's) needs nothing.
"""

from __future__ import annotations

# The build's share (cache.indexes.scripts.BUILD): a document it indexes, if it has a TTL, gets the entry in its
# mirror too, so an index declared over expiring documents loses their entries when they expire.
MIRROR_LUA = r"""
local function mirror_entry(itag, id, field, entry)
  if not redis.call('ZSCORE', itag .. 'xe', id) then return end
  local packed = redis.call('HGET', itag .. 'xm', id)
  local kept = {}
  if packed then
    local mirrored = cmsgpack.unpack(packed)
    for i = 1, #mirrored, 2 do
      if mirrored[i] ~= field then
        kept[#kept + 1] = mirrored[i]
        kept[#kept + 1] = mirrored[i + 1]
      end
    end
  end
  if entry then
    kept[#kept + 1] = field
    kept[#kept + 1] = entry
  end
  if #kept == 0 then
    redis.call('HDEL', itag .. 'xm', id)
  else
    redis.call('HSET', itag .. 'xm', id, cmsgpack.pack(kept))
  end
end
"""

EXPIRY_LUA = (
    MIRROR_LUA
    + r"""
-- WRITE_MANY's: by shard's index tag, whether its xe may hold an id (one EXISTS a call, not a ZSCORE a create;
-- nil elsewhere: a single write's create asks ZSCORE at once). Only mirror_expiry adds to xe in a write's call.
local expiring = nil
local function may_expire(itag)
  if not expiring then return true end
  local found = expiring[itag]
  if found == nil then
    found = redis.call('EXISTS', itag .. 'xe') == 1
    expiring[itag] = found
  end
  return found
end

-- A write that set a TTL (key: the document's hash, just EXPIREd): xe gets the hash's own expiry (the script's
-- frozen time plus the TTL, as Redis holds it), xm the entries the write left (indexed: index_fields', nil in a
-- shard without indexes, where a mirror left from when it had some names only indexes it no longer lists).
local function mirror_expiry(itag, key, id, indexed)
  redis.call('ZADD', itag .. 'xe', redis.call('PEXPIRETIME', key), id)
  if expiring then expiring[itag] = true end
  if not indexed then return end
  local mirrored = {}
  for i, field in ipairs(indexed.fields) do
    if indexed.entries[i] then
      mirrored[#mirrored + 1] = field
      mirrored[#mirrored + 1] = indexed.entries[i]
    end
  end
  if #mirrored == 0 then
    redis.call('HDEL', itag .. 'xm', id)
  else
    redis.call('HSET', itag .. 'xm', id, cmsgpack.pack(mirrored))
  end
end

-- A write that kept the expiry (a merge patch) and changed an entry of a document with a TTL: its mirror follows.
local function remirror(itag, key, id, indexed, held)
  local changed = false
  for i = 1, #indexed.fields do
    if held[1 + i] ~= indexed.entries[i] then changed = true end
  end
  if changed and redis.call('ZSCORE', itag .. 'xe', id) then mirror_expiry(itag, key, id, indexed) end
end

-- A document that no longer expires (PERSIST), or is deleted: nothing is left to carry out.
local function forget_expiry(itag, id)
  redis.call('ZREM', itag .. 'xe', id)
  redis.call('HDEL', itag .. 'xm', id)
end

-- The feed arguments of an expiry's event from a write's (its last FEED_ARGS, the operation replaced).
local function expiry_feed(A, feed_at)
  local args = {'expire'}
  for i = feed_at + 2, #A do args[#args + 1] = A[i] end
  return args
end

-- Carries out the expiry of `id`, whose hash is gone (the caller saw it so), due at `at` (ms): its mirrored entries
-- leave the indexes the shard lists (a dropped index's are gone already), the id leaves the shard's id index and
-- xe/xm, and with a feed (`feed_key`, `feed_args`: log_change's, operation 'expire') its event is logged with the
-- time it was due (t) and a delete's marks. Every entry ends with its id: it can remove no other document's.
local function expire_one(itag, ids_key, id, at, feed_key, feed_args)
  local xm = itag .. 'xm'
  local marks = {'t', string.format('%d', tonumber(at))}
  local packed = redis.call('HGET', xm, id)
  if packed then
    local listed = {}
    for _, name in ipairs(redis.call('HKEYS', itag .. 'xst')) do listed['x:' .. name] = true end
    local mirrored = cmsgpack.unpack(packed)
    for i = 1, #mirrored, 2 do
      local field, value = mirrored[i], mirrored[i + 1]
      if listed[field] then
        redis.call('ZREM', itag .. field, unpack(entries_of(field, value)))
        marks[#marks + 1] = 'w' .. string.sub(field, 2)
        marks[#marks + 1] = value
      end
    end
    redis.call('HDEL', xm, id)
  end
  redis.call('ZREM', ids_key, id)
  redis.call('ZREM', itag .. 'xe', id)
  if feed_key then log_change({false, ids_key, feed_key}, feed_args, id, '', marks) end
end

-- Up to `step` of the shard's ids due by Redis's clock (TIME, not the script's frozen time), each expired whose hash
-- is gone (EXISTS deletes a hash past its expiry); one whose hash is still there (due between the script's start
-- and TIME, or given another expiry outside Jetway) is scored again with its PEXPIRETIME, or forgotten without one.
-- ids_key: the shard's id index (jw:{<coll>:<shard>}:i); feed_key, feed_args: expire_one's (nil: no feed).
-- Returns {expired, looked at, the shard's next due time ('' when none)}.
local function expire_due(ids_key, step, feed_key, feed_args)
  local itag = index_tag(ids_key)
  local xe = itag .. 'xe'
  local now = redis.call('TIME')
  local now_ms = string.format('%d', tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000))
  local due = redis.call('ZRANGEBYSCORE', xe, '-inf', now_ms, 'WITHSCORES', 'LIMIT', 0, step)
  local documents = string.sub(ids_key, 1, -2) .. 'd:'
  local expired = 0
  for i = 1, #due, 2 do
    local id = due[i]
    local key = documents .. id
    if redis.call('EXISTS', key) == 0 then
      expire_one(itag, ids_key, id, due[i + 1], feed_key, feed_args)
      expired = expired + 1
    else
      local at = redis.call('PEXPIRETIME', key)
      if at > 0 then redis.call('ZADD', xe, at, id) else forget_expiry(itag, id) end
    end
  end
  local first = redis.call('ZRANGE', xe, 0, 0, 'WITHSCORES')
  return {expired, #due / 2, first[2] or ''}
end
"""
)
