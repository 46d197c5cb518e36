local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
local out = {}
for _, m in ipairs(ids) do
  local cur = redis.call('HMGET', ARGV[3] .. m, 'n', 's', 'u')
  if cur[2] == 'failed' then
    out[#out + 1] = m
    out[#out + 1] = cur[1]
    out[#out + 1] = cur[3]
  else
    redis.call('ZREM', KEYS[1], m)
  end
end
return out
