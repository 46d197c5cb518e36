local now = tonumber(ARGV[6])
local v = redis.call('GET', KEYS[1])
local s, t, f, a, l, c, x, e, u, h = parse(v)
if not s then return redis.error_reply('webhook-guard: corrupt record') end
local ln, en = tonumber(l), tonumber(e)
local live = s == 'in_progress' and ln > now
if en <= now and not live then
  unlist(ARGV[9], ARGV[3], s, t)
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('ZADD', KEYS[2], ARGV[7], ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[10])
  return 0
end
local unknown = string.rep('0', 64)
if (f == ARGV[4] or f == unknown or ARGV[4] == unknown) and (s == 'failed' or (s == 'in_progress' and not live)) then
  unlist(ARGV[9], ARGV[3], s, t)
  if s == 'in_progress' then x = tonumber(x) + 1 end
  if tonumber(ARGV[8]) > en then e = ARGV[8] end
  if f == unknown then f = ARGV[4] end
  local nv = table.concat({'in_progress', ARGV[5], f, tonumber(a) + 1, ARGV[7], c, x, e, ARGV[6], h}, '|')
  redis.call('SET', KEYS[1], nv, 'PX', ttl(math.max(tonumber(e), tonumber(ARGV[7])), now))
  redis.call('ZADD', KEYS[2], ARGV[7], ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[10])
  return {1, nv}
end
-- Kept: the listing entry the claim's transaction filed goes, unless the record is
-- this very claim's (a repeated run).
if not (s == 'in_progress' and t == ARGV[5]) then redis.call('ZREM', KEYS[3], ARGV[10]) end
return {2, v}
