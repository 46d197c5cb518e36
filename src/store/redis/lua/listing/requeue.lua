if redis.call('HGET', KEYS[1], 's') ~= 'dead' then return 0 end
redis.call('HSET', KEYS[1], 's', 'pending', 'n', ARGV[2], 'a', 0, 'u', ARGV[2])
redis.call('PERSIST', KEYS[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
return 1
