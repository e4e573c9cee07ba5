"""Lua scripts of `RedisMetadataStore`: every multi-key change runs as one script (atomic).

Field values are JSON, so a status reads `"running"` (quoted) and a number reads as itself.
"""

_CREATE_COLLECTION = """
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then
  return redis.call('HGET', KEYS[1], ARGV[1])
end
redis.call('HSET', KEYS[2], unpack(ARGV, 4))
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[2])
return ARGV[2]
"""
_DELETE_COLLECTION = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('ZCARD', KEYS[2]) > 0 then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[2])
return 1
"""
# a tenant's usage, summed over its collections' documents: {bytes, documents, pages};
# ARGV[1] the key prefix ("<prefix>:"), ARGV[2] the tenant
_USAGE_OF = """
local function usage_of(prefix, tenant)
  local bytes, docs, pages = 0, 0, 0
  for _, col in ipairs(redis.call('ZRANGE', prefix .. 'tenant:' .. tenant, 0, -1)) do
    for _, doc in ipairs(redis.call('ZRANGE', prefix .. 'coldocs:' .. col, 0, -1)) do
      local v = redis.call('HMGET', prefix .. 'doc:' .. doc, 'size_bytes', 'pages_total')
      if v[1] then
        bytes = bytes + tonumber(v[1])
        docs = docs + 1
        pages = pages + tonumber(v[2] or '0')
      end
    end
  end
  return {bytes, docs, pages}
end
"""
_USAGE = _USAGE_OF + """
return usage_of(ARGV[1], ARGV[2])
"""
# ARGV: document id, created_at, key prefix, quota bytes, documents, pages (0 = unlimited),
# the document's bytes and pages, then HSET pairs. -1 = no collection, 0 = the id exists,
# 1 = added, {2, which (1 bytes, 2 documents, 3 pages), used} = a quota would be exceeded
_ADD_DOCUMENT = _USAGE_OF + """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local tenant = cjson.decode(redis.call('HGET', KEYS[1], 'tenant'))
local used = usage_of(ARGV[3], tenant)
local adding = {tonumber(ARGV[7]), 1, tonumber(ARGV[8])}
for i = 1, 3 do
  local limit = tonumber(ARGV[3 + i])
  if limit > 0 and used[i] + adding[i] > limit then return {2, i, used[i]} end
end
redis.call('HSET', KEYS[2], unpack(ARGV, 9))
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
return 1
"""
_UPDATE_IF_EXISTS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
"""
_PUT_PAGES = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
for _, h in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  redis.call('SREM', ARGV[1] .. h, ARGV[2])
end
redis.call('DEL', KEYS[2], KEYS[3])
local n = tonumber(ARGV[3])
for i = 0, n - 1 do
  redis.call('HSET', KEYS[2], ARGV[4 + 2 * i], ARGV[5 + 2 * i])
end
for i = 4 + 2 * n, #ARGV do
  redis.call('SADD', KEYS[3], ARGV[i])
  redis.call('SADD', ARGV[1] .. ARGV[i], ARGV[2])
end
return 1
"""
_DELETE_DOCUMENT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local orphans = {}
for _, h in ipairs(redis.call('SMEMBERS', KEYS[3])) do
  redis.call('SREM', ARGV[1] .. h, ARGV[2])
  if redis.call('EXISTS', ARGV[1] .. h) == 0 then table.insert(orphans, h) end
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[2])
return orphans
"""
# add a job and index it as active (zset `activejobs`, scored by its heartbeat)
_ADD_JOB = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[2])
return 1
"""
# ARGV: job id, now, terminal (1/0), then HSET pairs
_UPDATE_JOB = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 4))
if ARGV[3] == '1' then redis.call('ZREM', KEYS[2], ARGV[1])
else redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1]) end
return 1
"""
# ARGV: job id, now, lease seconds. -1 = no job, 0 = finished or leased, 1 = claimed
_CLAIM_JOB = """
if redis.call('EXISTS', KEYS[1]) == 0 then return -1 end
local st = redis.call('HGET', KEYS[1], 'status')
if st == '"succeeded"' or st == '"failed"' then return 0 end
local beat = tonumber(redis.call('HGET', KEYS[1], 'updated_at') or '0') or 0
if st == '"running"' and tonumber(ARGV[2]) - beat < tonumber(ARGV[3]) then return 0 end
redis.call('HSET', KEYS[1], 'status', '"running"', 'error', 'null', 'updated_at', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'attempts', 1)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
"""
_HEARTBEAT_JOB = """
if redis.call('HGET', KEYS[1], 'status') ~= '"running"' then return 0 end
redis.call('HSET', KEYS[1], 'updated_at', ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
"""

SCRIPTS = {
    "create_collection": _CREATE_COLLECTION, "delete_collection": _DELETE_COLLECTION,
    "add_document": _ADD_DOCUMENT, "usage": _USAGE, "update": _UPDATE_IF_EXISTS,
    "put_pages": _PUT_PAGES,
    "delete_document": _DELETE_DOCUMENT, "add_job": _ADD_JOB, "update_job": _UPDATE_JOB,
    "claim_job": _CLAIM_JOB, "heartbeat_job": _HEARTBEAT_JOB,
}
