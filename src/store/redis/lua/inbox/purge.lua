local now = tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local removed = 0
for _, id in ipairs(ids) do
  local k = ARGV[3] .. id
  local cur = redis.call('HMGET', k, 's', 'x')
  local s, x = cur[1], tonumber(cur[2] or '0')
  if not s then
    redis.call('ZREM', KEYS[1], id)
    removed = removed + 1
  elseif (SETTLED) and x <= now then
    redis.call('DEL', k)
    redis.call('ZREM', KEYS[1], id)
    removed = removed + 1
  elseif (SETTLED) then
    redis.call('ZADD', KEYS[1], x, id)
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return {removed, #ids}
