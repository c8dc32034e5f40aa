"""The Lua that keeps declared indexes exact: in each write's script, in the build's steps, in the query's reads.

Layout, beside a shard's documents (``cache.keys``), all under the shard's
hash tag so every script stays on one slot:

    ji:{<coll>:<shard>}:xs              STRING the shard's spec: {"g": generation,
                                               "i": [{"n", "v", "f", "b"?}, ...]}
    ji:{<coll>:<shard>}:xd              STRING the digest of the indexes the spec lists
    ji:{<coll>:<shard>}:xst             HASH   <name>:<v> -> "1" built, "0<position>" building
    ji:{<coll>:<shard>}:x:<name>:<v>    ZSET   the index's entries, all score 0
    ji:{<coll>:<shard>}:xgc             HASH   x:<name>:<v> -> the last id swept: a dropped
                                               index's fields, left in documents' hashes
    jw:{<coll>:<shard>}:d:<id>  field x:<name>:<v>  the document's entry in it; a multi-entry
                                               index's (an array field, version "m..."): all
                                               its entries, each after its 2-byte length

The index keys have the documents' hash tag (one slot) but not their
prefix: the hot cache's tracking follows every key under ``jw:{``
(``cache.hot.tracking``), and an index's sorted sets are nothing it caches, so
their changes would only be invalidation messages to every worker.

An entry is its values' bytes then the id (``cache.indexes.values``, whose
encoding ``_ENCODE`` repeats). ``b`` in an index's spec is its build's
position in the shard (the last id done; "" before the first): absent,
the index is built there.

Writes: the PUT's script reads the document's index fields with its ETag
(``index_fields``) and sets the changed ones with its body
(``move_entries``), one HMGET and one HSET for the document whatever the
number of indexes; the DELETE's takes the entries out (``unindex``) before
the hash goes. A write checks the shard's spec itself, so an index declared
a moment ago is kept by every write from the moment its spec reached the
shard, whatever the worker's settings cache says; the build (``BUILD``)
does the documents written before. The worker sends the entries it computed
for the indexes its settings list, with their digest
(``cache.indexes.declared.index_args``): when the shard's spec has that digest they
are the ones it would compute, and Redis takes them; otherwise (the worker
has not yet heard of a change) Redis decodes the spec and the body and
computes them. A document whose body Redis's cjson cannot read then (nested
past its 1,000 levels, a lone surrogate escape) is refused
(``UNINDEXABLE``) before anything is written; a build leaves such a
document out of the index. So is a document whose array field holds more
than ``MAX_ARRAY_ENTRIES`` elements: the worker sends no entries for it
(``index_args``), so that its shard's script refuses it in every entry
point alike. A multi-entry index's field changes as a whole; a write then
removes and adds only the entries that differ (``replace_entries``), and a
query's check that the document still holds an entry looks among them.
"""

from __future__ import annotations

from cache.indexes.expiry_scripts import MIRROR_LUA
from cache.indexes.values import MAX_ARRAY_ENTRIES, MAX_STRING_BYTES
from cache.redis.script import Script

# The encoding of cache.indexes.values, value by value; nil: no entry.
_ENCODE = r"""
local function index_value(value, kind)
  if kind == 's' then
    if type(value) ~= 'string' or #value > MAX_STRING_BYTES then return nil end
    return (string.gsub(value, '%z', '\0\255')) .. '\0\0'
  elseif kind == 'b' then
    if type(value) ~= 'boolean' then return nil end
    if value then return '\1' end
    return '\0'
  end
  if type(value) ~= 'number' then return nil end
  if not (value > -9007199254740992 and value < 9007199254740992) then return nil end
  if value == 0 then value = 0 end
  local bytes = struct.pack('>d', value)
  local first = string.byte(bytes, 1)
  if first >= 128 then
    return (string.gsub(bytes, '.', function(c) return string.char(255 - string.byte(c)) end))
  end
  return string.char(first + 128) .. string.sub(bytes, 2)
end

local function member_at(doc, tokens)
  local value = doc
  for _, token in ipairs(tokens) do
    if type(value) ~= 'table' then return nil end
    local found = value[token]
    if found == nil and string.match(token, '^%d+$') and (token == '0' or string.sub(token, 1, 1) ~= '0') then
      found = value[tonumber(token) + 1]
    end
    if found == nil then return nil end
    value = found
  end
  return value
end

-- The document's entry in the index, or nil. An index with an array field (field[3]): its entries, one per
-- distinct element, packed (cache.indexes.values.pack_entries); nil and a refusal when the array is too long.
local function index_entry(doc, index, id)
  local parts, array = {}, nil
  for i, field in ipairs(index.f) do
    local value = member_at(doc, field[2])
    if field[3] then
      if type(value) ~= 'table' then return nil end
      if #value > MAX_ARRAY_ENTRIES then
        return nil, 'an array field of an index holds at most MAX_ARRAY_ENTRIES elements, not ' .. #value
      end
      array = {at = i, values = value, kind = field[1]}
      parts[i] = ''
    else
      local encoded = index_value(value, field[1])
      if not encoded then return nil end
      parts[i] = encoded
    end
  end
  if not array then return table.concat(parts) .. id end
  local before = table.concat(parts, '', 1, array.at - 1)
  local after = table.concat(parts, '', array.at + 1) .. id
  local packed, seen = {}, {}
  for _, value in ipairs(array.values) do
    local encoded = index_value(value, array.kind)
    if encoded then
      local one = before .. encoded .. after
      if not seen[one] then
        seen[one] = true
        packed[#packed + 1] = struct.pack('>H', #one) .. one
      end
    end
  end
  if #packed == 0 then return nil end
  return table.concat(packed)
end

local function shard_spec(itag)
  local spec = redis.call('GET', itag .. 'xs')
  if not spec then return nil end
  return cjson.decode(spec)
end

local function entry_field(index)
  return 'x:' .. index.n .. ':' .. index.v
end
""".replace("MAX_STRING_BYTES", str(MAX_STRING_BYTES)).replace("MAX_ARRAY_ENTRIES", str(MAX_ARRAY_ENTRIES))

# A multi-entry index's field (cache.indexes.values: its version starts with "m"), for every script that reads one.
ENTRIES_LUA = r"""
local function multi(field)
  return string.byte(field, -12) == 109
end

-- The entries a document's field of an index holds: its value, or a multi-entry index's packed entries.
local function entries_of(field, value)
  if not value then return {} end
  if not multi(field) then return {value} end
  local out, at = {}, 1
  while at < #value do
    local length = struct.unpack('>H', value, at)
    out[#out + 1] = string.sub(value, at + 2, at + 1 + length)
    at = at + 2 + length
  end
  return out
end

-- Whether a document's field holds ``entry``: it is its value, or one of its packed entries.
local function holds_entry(field, value, entry)
  if value == entry then return true end
  if not value or not multi(field) then return false end
  for _, one in ipairs(entries_of(field, value)) do
    if one == entry then return true end
  end
  return false
end

-- The index's entries go from those in ``before`` (a field's value, or nil) to those in ``now``: the ones only
-- in ``before`` leave, and the ones only in ``now`` join (all of them, with ``all``).
local function replace_entries(zkey, field, before, now, all)
  local old, new = entries_of(field, before), entries_of(field, now)
  local was, kept, gone, added = {}, {}, {}, {}
  for _, one in ipairs(old) do was[one] = true end
  for _, one in ipairs(new) do
    kept[one] = true
    if all or not was[one] then
      added[#added + 1] = '0'  -- a string: Redis formats a Lua number given to redis.call, at every call
      added[#added + 1] = one
    end
  end
  for _, one in ipairs(old) do
    if not kept[one] then gone[#gone + 1] = one end
  end
  if #gone > 0 then redis.call('ZREM', zkey, unpack(gone)) end
  if #added > 0 then redis.call('ZADD', zkey, unpack(added)) end
end
"""

# The part the document writes' scripts share (cache.documents.scripts): their K[2] is the shard's id index, "<tag>i".
WRITE_LUA = (
    _ENCODE
    + ENTRIES_LUA
    + r"""
-- The shard's index tag ('ji:{<coll>:<shard>}:') from its id index's key ('jw:{<coll>:<shard>}:i'): index keys
-- share the documents' slot, but not the prefix the hot cache's tracking follows (cache.hot.tracking).
local function index_tag(ids_key)
  return 'ji:' .. string.sub(ids_key, 4, -2)
end

-- WRITE_MANY's: each shard's spec digest, read once a call (only the spec's own script sets it, never a write).
local digests = nil

-- The document's fields a write reads beside its ETag and sets beside its body, one per index the shard keeps,
-- and their entries when the write's worker made them for the shard's spec: {fields, entries}, or {fields,
-- spec} (Redis makes the entries, own_entries); nil when the shard keeps no index. A write's arguments from
-- `at`: their number, the digest of the spec they were made for, then field and entry ('' for none) pairs.
local function index_fields(itag, A, at)
  local digest = digests and digests[itag]
  if digest == nil then
    digest = redis.call('GET', itag .. 'xd')
    if digests then digests[itag] = digest end
  end
  if not digest then return nil end
  local indexed = {fields = {}}
  if digest == A[at + 1] then
    indexed.entries = {}
    for i = 1, tonumber(A[at]) do
      indexed.fields[i] = A[at + 2 * i]
      indexed.entries[i] = A[at + 2 * i + 1] ~= '' and A[at + 2 * i + 1]
    end
  else
    indexed.spec = shard_spec(itag)
    for i, index in ipairs(indexed.spec.i) do indexed.fields[i] = entry_field(index) end
  end
  return indexed
end

-- The entries of a document whose worker made none for the shard's spec (it had not heard of a change yet):
-- from its body, before anything is written, since a body cjson cannot read is refused.
local function own_entries(indexed, id, body)
  local ok, doc = pcall(cjson.decode, body)
  if not ok then
    return error({err = 'UNINDEXABLE the document cannot be indexed (' .. tostring(doc) .. ')'})
  end
  local entries = {}
  for i, index in ipairs(indexed.spec.i) do
    local entry, refused = index_entry(doc, index, id)
    if refused then return error({err = 'UNINDEXABLE index ' .. index.n .. ': ' .. refused}) end
    entries[i] = entry or false
  end
  return entries
end

-- Moves a document's entries from those it held (held[at + i]: its fields' values, false for none) to the
-- write's: a changed entry leaves its index and the new one joins it. The fields to set join `sets` and those
-- to remove `dels`, for the write's own HSET and HDEL of its document. With `marked`, returns what its
-- change-feed event carries for live queries (cache.feed.live_queries): each entry now (x:<name>:<v>, none: no
-- field) and, where it changed, the one before (w:<name>:<v>, '' for none).
local function move_entries(itag, indexed, held, at, sets, dels, marked)
  local marks = nil
  if marked then marks = {} end
  for i, field in ipairs(indexed.fields) do
    local entry, before = indexed.entries[i], held[at + i]
    if marks then
      if entry then
        marks[#marks + 1] = field
        marks[#marks + 1] = entry
      end
      if before ~= entry then
        marks[#marks + 1] = 'w' .. string.sub(field, 2)
        marks[#marks + 1] = before or ''
      end
    end
    if before ~= entry then
      if multi(field) then
        replace_entries(itag .. field, field, before, entry, false)
      else
        if before then redis.call('ZREM', itag .. field, before) end
        if entry then redis.call('ZADD', itag .. field, '0', entry) end
      end
      if entry then
        sets[#sets + 1] = field
        sets[#sets + 1] = entry
      else
        dels[#dels + 1] = field
      end
    end
  end
  return marks
end

-- Takes a document about to be removed (the caller removes its hash) out of the shard's indexes. The index
-- states' hash names them, so no spec is decoded. Returns its event's marks (move_entries): each entry it
-- had, as the one before (w:<name>:<v>).
local function unindex(itag, key)
  local fields = redis.call('HKEYS', itag .. 'xst')
  if #fields == 0 then return nil end
  for i, name in ipairs(fields) do fields[i] = 'x:' .. name end
  local held = redis.call('HMGET', key, unpack(fields))
  local marks = {}
  for i, field in ipairs(fields) do
    if held[i] then
      redis.call('ZREM', itag .. field, unpack(entries_of(field, held[i])))
      marks[#marks + 1] = 'w' .. string.sub(field, 2)
      marks[#marks + 1] = held[i]
    end
  end
  return marks
end
"""
)

# KEYS: the shard's spec. ARGV: generation, the indexes' spec (cache.indexes.declared.spec_json).
# Stores the spec unless the shard holds a later generation's; an index kept
# (same name and version) keeps its build position; one dropped loses its
# entries; one new starts its build ("" : from the first id, unless the shard
# has no documents). One dropped leaves its field in each document's hash
# to the shard's sweep (``xgc``, SWEEP). Returns the number of indexes dropped.
SPEC = Script(
    b"""
local tag = string.sub(KEYS[1], 1, -3)
local documents = 'jw:' .. string.sub(tag, 4)
local current = redis.call('GET', KEYS[1])
local old = {g = 0, i = {}}
if current then old = cjson.decode(current) end
local generation = tonumber(ARGV[1])
if old.g > generation then return -1 end
local wanted = cjson.decode(ARGV[2])
local kept = {}
for _, index in ipairs(old.i) do kept[index.n .. ':' .. index.v] = index end
local empty = redis.call('ZCARD', documents .. 'i') == 0
for _, index in ipairs(wanted) do
  local before = kept[index.n .. ':' .. index.v]
  -- Declared again before its fields were swept: they are its entries' fields again (its build sets each).
  redis.call('HDEL', tag .. 'xgc', 'x:' .. index.n .. ':' .. index.v)
  if before then
    index.b = before.b
    kept[index.n .. ':' .. index.v] = nil
  elseif not empty then
    index.b = ''
  end
end
local dropped = 0
for name, _ in pairs(kept) do
  redis.call('UNLINK', tag .. 'x:' .. name)
  -- Its field in each document's hash goes too, in paced steps (SWEEP, cache.indexes.builds).
  if not empty then redis.call('HSET', tag .. 'xgc', 'x:' .. name, '') end
  dropped = dropped + 1
end
redis.call('DEL', tag .. 'xst')
if #wanted == 0 then
  redis.call('DEL', KEYS[1], tag .. 'xd')
else
  redis.call('SET', KEYS[1], cjson.encode({g = generation, i = wanted}))
  -- What a write's own entries must have been made for (cache.indexes.declared.index_args): the spec's digest.
  redis.call('SET', tag .. 'xd', redis.sha1hex(ARGV[2]))
  -- Each index's state, for queries and progress to read without decoding the spec.
  for _, index in ipairs(wanted) do
    local state = '1'
    if index.b then state = '0' .. index.b end
    redis.call('HSET', tag .. 'xst', index.n .. ':' .. index.v, state)
  end
end
return dropped
"""
)

# KEYS: the shard's spec, its id index. ARGV: index name, version, how many documents this step, and the
# bytes of documents after which it stops (a step of large documents would hold Redis for their decoding).
# Indexes the next documents of the shard after the build's position, each
# from its stored body (a write since the index's spec arrived has indexed
# its document already: this sets the same entry again). Returns {done,
# position}: done is 1 once the shard is built (or the index is gone).
BUILD = Script(
    (
        _ENCODE
        + ENTRIES_LUA
        + MIRROR_LUA
        + """
-- Sets one document's entry (entries) in the index, adding it to the sorted set even when the document's field
-- says it holds it already (the field of a dropped index may outlive its entries).
local function build_entry(itag, key, field, entry)
  local before = redis.call('HGET', key, field)
  replace_entries(itag .. field, field, before, entry, true)
  if entry then
    if before ~= entry then redis.call('HSET', key, field, entry) end
  elseif before then
    redis.call('HDEL', key, field)
  end
end

local spec = redis.call('GET', KEYS[1])
if not spec then return {1, ''} end
spec = cjson.decode(spec)
local index = nil
for _, candidate in ipairs(spec.i) do
  if candidate.n == ARGV[1] and candidate.v == ARGV[2] then index = candidate end
end
if not index or index.b == nil then return {1, ''} end
local tag = string.sub(KEYS[1], 1, -3)
local documents = 'jw:' .. string.sub(tag, 4)
local start = '-'
if index.b ~= '' then start = '(' .. index.b end
local ids = redis.call('ZRANGEBYLEX', KEYS[2], start, '+', 'LIMIT', 0, tonumber(ARGV[3]))
local bytes, cap, last = 0, tonumber(ARGV[4]), nil
for _, id in ipairs(ids) do
  local key = documents .. 'd:' .. id
  local body = redis.call('HGET', key, 'b')
  if body then
    local ok, doc = pcall(cjson.decode, body)
    local entry = nil
    if ok then entry = index_entry(doc, index, id) end
    build_entry(tag, key, entry_field(index), entry)
    mirror_entry(tag, id, entry_field(index), entry)  -- a document with a TTL: its mirror too (expiry_scripts)
    bytes = bytes + #body
  else
    mirror_entry(tag, id, entry_field(index), nil)  -- expired: no entry, and its mirror says none either
  end
  last = id
  if bytes >= cap then break end
end
local state = '1'
if #ids < tonumber(ARGV[3]) and last == ids[#ids] then
  index.b = nil
else
  index.b = last
  state = '0' .. last
end
redis.call('SET', KEYS[1], cjson.encode(spec))
redis.call('HSET', tag .. 'xst', ARGV[1] .. ':' .. ARGV[2], state)
if index.b == nil then return {1, ''} end
return {0, index.b}
"""
    ).encode()
)

# KEYS: the shard's dropped fields (xgc), its id index. ARGV: a dropped index's field (x:<name>:<v>), how many
# documents this step. Removes that field from the next documents after the sweep's position; once past the
# last, the field is forgotten. Returns {done, position} as BUILD does.
SWEEP = Script(
    b"""
local position = redis.call('HGET', KEYS[1], ARGV[1])
if not position then return {1, ''} end
local start = '-'
if position ~= '' then start = '(' .. position end
local step = tonumber(ARGV[2])
local ids = redis.call('ZRANGEBYLEX', KEYS[2], start, '+', 'LIMIT', 0, step)
local documents = string.sub(KEYS[2], 1, -2) .. 'd:'
for _, id in ipairs(ids) do redis.call('HDEL', documents .. id, ARGV[1]) end
if #ids < step then
  redis.call('HDEL', KEYS[1], ARGV[1])
  return {1, ''}
end
redis.call('HSET', KEYS[1], ARGV[1], ids[#ids])
return {0, ids[#ids]}
"""
)
