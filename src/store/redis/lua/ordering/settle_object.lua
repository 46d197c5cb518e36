local cur = redis.call('HMGET', KEYS[1], 'n', 's', 'u')
if cur[1] ~= ARGV[1] then return 0 end
if ARGV[5] == 'if_failed' and not (cur[2] == 'failed' and tonumber(cur[3]) and tonumber(cur[3]) <= tonumber(ARGV[6])) then return 0 end
local first = cur[2] == 'pending' or ARGV[5] ~= 'settle'
if not first and ARGV[2] ~= 'failed' then return 0 end
redis.call('HSET', KEYS[1], 's', ARGV[2], 'u', ARGV[3])
if ARGV[2] == 'failed' then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
elseif cur[2] == 'failed' then
  redis.call('ZREM', KEYS[2], ARGV[4])
end
if first then return 1 end
return 0
