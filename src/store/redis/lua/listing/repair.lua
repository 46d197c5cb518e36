local v = redis.call('GET', KEYS[1])
if v then
  local s, t, u = string.match(v, '^([^|]*)|([^|]*)|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|(%-?%d+)|')
  if s == ARGV[2] and (s ~= 'in_progress' or t == ARGV[3]) then
    redis.call('ZADD', KEYS[2], u, ARGV[1])
    return 1
  end
end
redis.call('ZREM', KEYS[2], ARGV[1])
return 0
