local cur = redis.call('HMGET', KEYS[1], 's', 't')
if cur[1] ~= 'running' or cur[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 'l', ARGV[3])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return 1
