local cur = redis.call('HMGET', KEYS[1], 's', 't', 'l', 'u', 'a')
if ARGV[3] ~= 'running' and cur[1] == ARGV[3] and cur[2] == ARGV[2] and cur[4] == ARGV[5] then return 1 end
if cur[1] ~= 'running' or cur[2] ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[1], 's', ARGV[3], 'n', ARGV[4], 'u', ARGV[5], 'x', ARGV[6])
if ARGV[8] == '0' and (tonumber(cur[5]) or 0) > 0 then redis.call('HINCRBY', KEYS[1], 'a', -1) end
if ARGV[9] then redis.call('HSET', KEYS[1], 'e', ARGV[9]) end
if ARGV[3] == 'pending' then
  redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
elseif ARGV[3] == 'running' then
  redis.call('ZADD', KEYS[2], cur[3], ARGV[1])
else
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[1])
  redis.call('PEXPIRE', KEYS[1], ARGV[7])
end
return 1
