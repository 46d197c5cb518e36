for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[2], 'LIMIT', 0, TIDY_BATCH)) do
  local v = redis.call('GET', ARGV[1] .. m)
  if not v then
    redis.call('ZREM', KEYS[1], m)
    unlist_gone(ARGV[3], m)
  elseif string.sub(v, 1, 12) ~= 'in_progress|' then
    local e = string.match(v, '^[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|[^|]*|([^|]*)|')
    -- One that does not read stays where it is, for the purge to remove.
    if e and string.find(e, '^%-?%d+$') then redis.call('ZADD', KEYS[1], e, m) end
  end
end
return 0
