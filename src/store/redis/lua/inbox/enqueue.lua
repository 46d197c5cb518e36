local old = redis.call('HMGET', KEYS[1], 's', 'f', 'x')
local s = old[1]
if s then
  if not ((SETTLED) and tonumber(old[3] or '0') <= tonumber(ARGV[2])) then
    return {s, old[2]}
  end
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
