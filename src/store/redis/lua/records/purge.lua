local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', tonumber(ARGV[4]), tonumber(ARGV[2]))
local removed, kept = 0, 0
for _, m in ipairs(due) do
  local k = ARGV[3] .. m
  local v = redis.call('GET', k)
  local s, t, f, a, l, c, x, e
  if v then s, t, f, a, l, c, x, e = parse(v) end
  if not s then
    if v then redis.call('DEL', k) end
    redis.call('ZREM', KEYS[1], m)
    unlist_gone(ARGV[5], m)
    removed = removed + 1
  else
    local ln, en = tonumber(l), tonumber(e)
    local live = s == 'in_progress' and ln > now
    if en <= now and not live then
      redis.call('DEL', k)
      redis.call('ZREM', KEYS[1], m)
      unlist(ARGV[5], m, s, t)
      removed = removed + 1
    elseif live then
      redis.call('ZADD', KEYS[1], l, m)
    elseif s == 'in_progress' then
      kept = kept + 1
    else
      redis.call('ZADD', KEYS[1], e, m)
    end
  end
end
return {removed, #due, kept}
