local cur = redis.call('HMGET', KEYS[1], 'n', 's')
if cur[1] and tonumber(ARGV[1]) < tonumber(cur[1]) then return tonumber(cur[1]) end
if cur[1] and tonumber(ARGV[1]) == tonumber(cur[1]) then return false end
redis.call('HSET', KEYS[1], 'n', ARGV[1], 's', 'pending', 'u', ARGV[2])
if cur[2] == 'failed' then redis.call('ZREM', KEYS[2], ARGV[3]) end
return false
