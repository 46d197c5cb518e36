local out = {}
for i = 1, #KEYS / 4 do
  local k, a = 4 * i - 3, 9 * i - 9
  local v, fence = redis.call('GET', KEYS[k]), ARGV[a + 1]
  if not v or string.sub(v, 1, #fence) ~= fence then
    redis.call('ZREM', KEYS[k + 2], ARGV[a + 7])
    out[i] = 0
  else
    local fa, l, c = string.match(v, '^([^|]*|[^|]*|)([^|]*)|([^|]*)|', #fence + 1)
    if not c or not string.find(l, '^%-?%d+$') then
      out[i] = -1
    else
      redis.call('SET', KEYS[k], ARGV[a + 2] .. fa .. l .. '|' .. c .. '|' .. ARGV[a + 3], 'PX', ARGV[a + 4])
      if tonumber(ARGV[a + 5]) < tonumber(l) then redis.call('ZADD', KEYS[k + 1], ARGV[a + 5], ARGV[a + 6]) end
      redis.call('ZREM', KEYS[k + 2], ARGV[a + 7])
      redis.call('ZADD', KEYS[k + 3], ARGV[a + 9], ARGV[a + 8])
      out[i] = 1
    end
  end
end
return out
