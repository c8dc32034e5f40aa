"""The Lua scripts that change a document and its index entry atomically.

Each script touches only keys of one hash slot (a document and its index
shard, see ``cache.keys``), so the same scripts run on Redis Cluster.
Conditions arrive pre-parsed: ``''`` (no header), ``'*'``, or entity tags
separated by spaces (entity tags cannot contain spaces).
"""

from __future__ import annotations

from cache.feed.feed_lua import FEED_LUA as _FEED
from cache.indexes.expiry_scripts import EXPIRY_LUA
from cache.indexes.scripts import WRITE_LUA
from cache.redis.lazy_lua import made_on_first_use
from cache.redis.script import Script

_CONDITIONS = """
local function matches(header, current)
  if header == '*' then return current ~= false end
  if not current then return false end
  for tag in string.gmatch(header, '%S+') do
    if tag == current then return true end
  end
  return false
end

local function holds(current, if_match, if_none_match)
  if if_match ~= '' and not matches(if_match, current) then return false end
  if if_none_match ~= '' and matches(if_none_match, current) then return false end
  return true
end
"""


# KEYS: document, index shard[, change feed].
# ARGV: id, body, etag, last-modified, ttl ('' keeps the expiry, '0' removes
# it, N sets N seconds), If-Match, If-None-Match, then the number N of
# compressed variants, N field/value pairs (cache.documents.variants), and last the
# variant fields to remove (an earlier version may have had them), then
# the feed's arguments (_FEED).
# Returns 0 when a condition failed, 1 when replaced, 2 when created, and
# {3, last-modified} when the document already carries this write's ETag:
# ETags are never reused, so this very write was applied before (a retry
# carrying out an Idempotency-Key's plan again, cache.documents.idempotency); it
# logs no second event, as the first application logged it.
# The write of one document as a Lua function of its keys K and arguments
# A (a table): the single PUT's script calls it with KEYS and ARGV, and
# WRITE_MANY with each document's share of its own.
_PUT = """
-- WRITE_MANY's: by shard's id index, the ids its new documents add, in one ZADD a shard at the call's end (or
-- before a delete of the call, which may take one out again). A single write adds its own at once.
local listing = nil
local function list_id(ids_key, id)
  -- The score as a string: Redis formats a Lua number given to redis.call, at every call
  -- (docs/history/performance.md, "Lua numbers in redis.call").
  if not listing then return redis.call('ZADD', ids_key, '0', id) end
  local adds = listing[ids_key]
  if not adds then
    adds = {}
    listing[ids_key] = adds
  end
  adds[#adds + 1] = '0'
  adds[#adds + 1] = id
end
local function put(K, A)
  local itag = index_tag(K[2])
  local index_at = 9 + 2 * tonumber(A[8])
  local indexed = index_fields(itag, A, index_at)
  local stale = index_at + 2 + 2 * tonumber(A[index_at])
  local feed_at = feed_start(K, A)
  -- The document's ETag, then its index fields, then the variant fields this version has not: one read, so
  -- that only a variant field an earlier version has is deleted (no HDEL a write, when none has).
  local reads = {'e'}
  if indexed then
    for i, field in ipairs(indexed.fields) do reads[i + 1] = field end
  end
  local variants_at = #reads + 1
  for i = stale, feed_at do reads[#reads + 1] = A[i] end
  local held = redis.call('HMGET', K[1], unpack(reads))
  local current = held[1]
  if current == A[3] then return {3, redis.call('HGET', K[1], 'm')} end
  if not holds(current, A[6], A[7]) then return 0 end
  -- Before any write: Redis making the entries may refuse the document.
  if indexed and not indexed.entries then indexed.entries = own_entries(indexed, A[1], A[2]) end
  if not current and may_expire(itag) then
    -- A document whose hash expired and whose expiry was not carried out yet: first its expiry (its entries
    -- leave, its event precedes this create's), as the sweeper would have (cache.indexes.expiry_scripts).
    local due = redis.call('ZSCORE', itag .. 'xe', A[1])
    if due then expire_one(itag, K[2], A[1], due, K[3], K[3] and expiry_feed(A, feed_at)) end
  end
  local sets = {'b', A[2], 'e', A[3], 'm', A[4]}
  for i = 9, index_at - 1 do sets[#sets + 1] = A[i] end
  local dels = {}
  for i = variants_at, #reads do
    if held[i] then dels[#dels + 1] = reads[i] end
  end
  local marks = nil
  if indexed then marks = move_entries(itag, indexed, held, 1, sets, dels, K[3] ~= nil) end
  redis.call('HSET', K[1], unpack(sets))
  if #dels > 0 then redis.call('HDEL', K[1], unpack(dels)) end
  -- Each TTL set or cleared is mirrored (cache.indexes.expiry_scripts' invariant I); a write without one pays
  -- nothing more unless its document had one.
  if A[5] == '0' then
    -- a hash just made has no expiry
    if current and redis.call('PERSIST', K[1]) == 1 then forget_expiry(itag, A[1]) end
  elseif A[5] ~= '' then
    redis.call('EXPIRE', K[1], A[5])
    mirror_expiry(itag, K[1], A[1], indexed)
  elseif indexed and current then
    remirror(itag, K[1], A[1], indexed, held)
  end
  -- Only a new document joins the shard's id index: a hash with an ETag has its id there already (only a
  -- delete or a carried-out expiry takes an id out, with its hash), and a ZADD that changes nothing still costs
  -- Redis a command (docs/history/performance.md, "Writes' redis.calls on 2026-12-02").
  if not current then list_id(K[2], A[1]) end
  log_change(K, A, A[1], A[3], marks)
  if current then return 1 end
  return 2
end
"""
# What a plain write never calls (an index's, an expiry's, a stream's counting): made on first use in a call, not at
# every call (cache.redis.lazy_lua).
_RARE = (
    "trim_feed",
    "sizes_of",
    "index_value",
    "member_at",
    "index_entry",
    "shard_spec",
    "entry_field",
    "multi",
    "entries_of",
    "holds_entry",
    "replace_entries",
    "own_entries",
    "move_entries",
    "mirror_entry",
    "mirror_expiry",
    "remirror",
    "forget_expiry",
    "expiry_feed",
    "expire_one",
    "expire_due",
)


def _writes(*own: str) -> str:
    """A write script's definitions (the shared ones, then ``own``), its rare functions made on first use."""
    return made_on_first_use("".join((_CONDITIONS, _FEED, WRITE_LUA, EXPIRY_LUA, *own)), _RARE)


PUT = Script((_writes(_PUT) + "return put(KEYS, ARGV)\n").encode())

# KEYS: document, index shard[, change feed]. ARGV: id, If-Match[, the feed's (_FEED)].
# Returns 0 when the condition failed, -1 when missing, 1 when deleted.
_DELETE = """
local function delete(K, A)
  local current = redis.call('HGET', K[1], 'e')
  if not holds(current, A[2], '') then return 0 end
  if not current then return -1 end
  local itag = index_tag(K[2])
  local marks = unindex(itag, K[1])  -- then the hash goes, with its index fields
  if redis.call('PEXPIRETIME', K[1]) > 0 then forget_expiry(itag, A[1]) end
  redis.call('DEL', K[1])
  redis.call('ZREM', K[2], A[1])
  log_change(K, A, A[1], '', marks)
  return 1
end
"""
DELETE = Script((_writes(_DELETE) + "return delete(KEYS, ARGV)\n").encode())

# Many writes in one call (a batch's, cache.batches.groups), each as PUT or
# DELETE would make it alone, in order. KEYS: each write's own (document,
# index shard[, change feed]), ARGV[1] of them each. ARGV after it, per
# write: 'p' (put) or 'd' (delete), the number N of its arguments, then
# those N (PUT's or DELETE's ARGV). On a cluster every key is of one slot.
# Returns each write's answer as PUT or DELETE gives it, or {'err', message}
# for a write a Redis error refused (the others go on, as in a pipeline).
WRITE_MANY = Script(
    (
        _writes(_PUT, _DELETE)
        + """
local function list_ids()
  for ids_key, adds in pairs(listing) do redis.call('ZADD', ids_key, unpack(adds)) end
  listing = {}
end
local per = tonumber(ARGV[1])
local results = {}
nudges, counting, digests, listing, expiring = {}, {}, {}, {}, {}
local at, k = 2, 0
while at <= #ARGV do
  local n = tonumber(ARGV[at + 1])
  local K = {KEYS[k + 1], KEYS[k + 2]}
  if per == 3 then K[3] = KEYS[k + 3] end
  local A = {unpack(ARGV, at + 2, at + 1 + n)}
  local write = put
  if ARGV[at] == 'd' then
    list_ids()  -- an id a put of this call added goes in before a delete may take it out
    write = delete
  end
  local ok, answer = pcall(write, K, A)
  if not ok then
    if type(answer) == 'table' then answer = answer.err end
    answer = {'err', tostring(answer)}
  end
  results[#results + 1] = answer
  at, k = at + 2 + n, k + per
end
list_ids()
for channel, shards in pairs(nudges) do
  for shard, event in pairs(shards) do redis.call('PUBLISH', channel, shard .. ' ' .. event) end
end
return results
"""
    ).encode()
)

# What a script needs to carry out a shard's due expiries (cache.indexes.expiry_scripts): it defines
# ``expire_due(ids_key, step, feed_key, feed_args)``, where ids_key is the shard's id index (jw:{<coll>:<shard>}:i,
# every other key derived from it), step the most ids it looks at, and feed_key, feed_args the shard's stream and
# FeedLog.script_parts(b"expire", ...)'s arguments as a table (both nil: no feed). A script that must not count a
# document past its expiry (an exact count) runs it first, in the same script.
EXPIRE_DUE_LUA = _FEED + WRITE_LUA + EXPIRY_LUA

# KEYS: the shard's id index[, its change feed]. ARGV: how many due ids at most[, the feed's (_FEED), operation
# 'expire']. The sweeper's step (cache.documents.expiry): each shard's nudge once, after its expiries.
# Returns expire_due's {expired, looked at, next due ms or ''}.
EXPIRE_DUE = Script(
    (
        EXPIRE_DUE_LUA
        + """
local feed_args = nil
if KEYS[2] then
  nudges = {}
  feed_args = {}
  for i = 2, #ARGV do feed_args[#feed_args + 1] = ARGV[i] end
end
local answer = expire_due(KEYS[1], tonumber(ARGV[1]), KEYS[2], feed_args)
if nudges then
  for channel, shards in pairs(nudges) do
    for shard, event in pairs(shards) do redis.call('PUBLISH', channel, shard .. ' ' .. event) end
  end
end
return answer
"""
    ).encode()
)

# KEYS: index shard, then the documents of the ids in ARGV (same order).
# Drops index entries whose document has expired. Returns how many.
PRUNE = Script(
    b"""
local dropped = 0
for i, id in ipairs(ARGV) do
  if redis.call('EXISTS', KEYS[i + 1]) == 0 then
    dropped = dropped + redis.call('ZREM', KEYS[1], id)
  end
end
return dropped
"""
)

# KEYS: documents of one slot (one index shard, cache.keys). ARGV[1]: the
# bytes allowed; ARGV[i + 1]: how many times KEYS[i]'s body counts against
# them (an id asked twice is answered twice). A body is a JSON object, never
# empty, so a size of 0 is a missing document.
# Returns {1, size_1, ..., size_N, bodies}: the bodies present, concatenated
# in KEYS order, when the counted sizes fit; else {0, size_1, ..., size_N}
# and no body, so that neither Redis's reply nor the worker ever holds more
# than the allowance (cache.documents.bounded_reads). One pass: each body is read
# (HGET) and counted as it comes, and once the allowance is passed the rest
# are only measured (HSTRLEN): the script holds the allowance and one body
# at most, and a read that fits costs one call per document, not two (an
# export's HSTRLEN then HGET cost Redis more than the HGET alone:
# docs/history/performance.md, "Batches at Redis's pace"). One bulk string, not one per
# body: the driver parses a reply once it is whole, and an array of many
# large bodies would be parsed again at every read that brings a part of it.
READ_WITHIN = Script(
    b"""
local sizes, bodies = {}, {}
local total, allowance = 0, tonumber(ARGV[1])
for i, key in ipairs(KEYS) do
  if bodies then
    local body = redis.call('HGET', key, 'b')
    local size = body and #body or 0
    sizes[i] = size
    total = total + size * tonumber(ARGV[i + 1])
    if total > allowance then
      bodies = nil
    elseif body then
      bodies[#bodies + 1] = body
    end
  else
    sizes[i] = redis.call('HSTRLEN', key, 'b')
  end
end
if not bodies then
  table.insert(sizes, 1, 0)
  return sizes
end
table.insert(sizes, 1, 1)
sizes[#sizes + 1] = table.concat(bodies)
return sizes
"""
)

# READ_WITHIN for a reader bound by an owner rule (cache.ownership.OwnedReads):
# only the documents whose entry in the rule's index (the hash's field
# x:<name>:<version>, kept with the body by the writes' scripts:
# cache.indexes.scripts) is ARGV[2i] count; any other is read as a missing
# one (size 0, no body), so another's document is in no allowance and no
# reply. KEYS[1]: the shard's index states; KEYS[i], i >= 2: its documents.
# ARGV[1]: the bytes allowed; ARGV[2]: the index (<name>:<version>);
# ARGV[2i - 1], ARGV[2i]: how many times KEYS[i]'s body counts, and the entry
# it holds when it is the reader's. Returns READ_WITHIN's reply, or -1 when
# the shard's index is not built yet (a document's entry may be missing or stale).
READ_OWNED_WITHIN = Script(
    b"""
if redis.call('HGET', KEYS[1], ARGV[2]) ~= '1' then return -1 end
local field = 'x:' .. ARGV[2]
local sizes, bodies = {}, {}
local total, allowance = 0, tonumber(ARGV[1])
for i = 2, #KEYS do
  local key, entry = KEYS[i], ARGV[2 * i]
  if bodies then
    local held = redis.call('HMGET', KEYS[i], field, 'b')
    local body = held[1] == entry and held[2]
    local size = body and #body or 0
    sizes[i - 1] = size
    total = total + size * tonumber(ARGV[2 * i - 1])
    if total > allowance then
      bodies = nil
    elseif body then
      bodies[#bodies + 1] = body
    end
  elseif redis.call('HGET', key, field) == entry then
    sizes[i - 1] = redis.call('HSTRLEN', key, 'b')
  else
    sizes[i - 1] = 0
  end
end
if not bodies then
  table.insert(sizes, 1, 0)
  return sizes
end
table.insert(sizes, 1, 1)
sizes[#sizes + 1] = table.concat(bodies)
return sizes
"""
)

# KEYS: one document. ARGV[1]: the most bytes its body may have. Returns
# the body's size when it is larger (nothing is sent), else the fields b,
# e, m as HMGET does: a batch's get with its share of the batch's budget
# (cache.batches.batch).
READ_ONE_WITHIN = Script(
    b"""
local size = redis.call('HSTRLEN', KEYS[1], 'b')
if size > tonumber(ARGV[1]) then return size end
return redis.call('HMGET', KEYS[1], 'b', 'e', 'm')
"""
)

# READ_ONE_WITHIN for a reader bound by an owner rule, as READ_OWNED_WITHIN
# reads: KEYS[1]: the shard's index states; KEYS[2]: the document. ARGV[1]:
# the index (<name>:<version>); ARGV[2]: the entry the document holds when it
# is the reader's; ARGV[3]: the most bytes its body may have. Returns
# READ_ONE_WITHIN's reply ({nil, nil, nil} for another's document, as for a
# missing one), or -1 when the shard's index is not built yet.
READ_OWNED_ONE_WITHIN = Script(
    b"""
if redis.call('HGET', KEYS[1], ARGV[1]) ~= '1' then return -1 end
if redis.call('HGET', KEYS[2], 'x:' .. ARGV[1]) ~= ARGV[2] then return {false, false, false} end
local size = redis.call('HSTRLEN', KEYS[2], 'b')
if size > tonumber(ARGV[3]) then return size end
return redis.call('HMGET', KEYS[2], 'b', 'e', 'm')
"""
)

# The size of a document's body as READ_OWNED_ONE_WITHIN would read it (the
# same KEYS, ARGV[1] and ARGV[2]): 0 for another's document, as for a missing
# one; -1 when the shard's index is not built yet. A batch's bound gets are
# measured so before they are admitted (cache.batches.batch).
OWNED_SIZE = Script(
    b"""
if redis.call('HGET', KEYS[1], ARGV[1]) ~= '1' then return -1 end
if redis.call('HGET', KEYS[2], 'x:' .. ARGV[1]) ~= ARGV[2] then return 0 end
return redis.call('HSTRLEN', KEYS[2], 'b')
"""
)
