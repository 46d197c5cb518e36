local limit = #ARGV - 3
local out, n, seen = {}, 0, {}
local taken = redis.call('LRANGE', KEYS[2], 0, -1)
if #taken > 0 then
  for i, id in ipairs(taken) do
    local k = ARGV[3] .. id
    local cur = redis.call('HMGET', k, 's', 't')
    if cur[1] == 'running' and cur[2] == ARGV[3 + i] then
      out[#out + 1] = id
      out[#out + 1] = redis.call('HGETALL', k)
    end
  end
  return out
end
while n < limit do
  local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, limit - n)
  local progressed = false
  for _, id in ipairs(ids) do
    if not seen[id] then
      seen[id] = true
      progressed = true
      local k = ARGV[3] .. id
      local s = redis.call('HGET', k, 's')
      if s == 'pending' or s == 'running' then
        n = n + 1
        redis.call('HSET', k, 's', 'running', 't', ARGV[3 + n], 'l', ARGV[2], 'u', ARGV[1])
        redis.call('HINCRBY', k, 'a', 1)
        redis.call('ZADD', KEYS[1], ARGV[2], id)
        out[#out + 1] = id
        out[#out + 1] = redis.call('HGETALL', k)
      else
        redis.call('ZREM', KEYS[1], id)
      end
    end
  end
  if not progressed then break end
end
if n > 0 then
  for i = 1, #out, 2 do redis.call('RPUSH', KEYS[2], out[i]) end
  redis.call('PEXPIRE', KEYS[2], math.max(1, tonumber(ARGV[2]) - tonumber(ARGV[1])))
end
return out
