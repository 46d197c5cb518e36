local now = tonumber(ARGV[1])
local due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', tonumber(ARGV[4]), tonumber(ARGV[2]))
local out, n, kept = {#due, 0}, 2, 0
for _, m in ipairs(due) do
  local v = redis.call('GET', ARGV[3] .. m)
  local s, t, f, a, l, c, x, e
  if v then s, t, f, a, l, c, x, e = parse(v) end
  if not v then
    redis.call('ZREM', KEYS[1], m)
    unlist_gone(ARGV[5], m)
  elseif not s then
    kept = kept + 1
  elseif s == 'in_progress' then
    if tonumber(l) > now then
      redis.call('ZADD', KEYS[1], l, m)
    else
      kept = kept + 1
      out[n + 1] = m
      out[n + 2] = v
      n = n + 2
    end
  elseif tonumber(e) > now then
    redis.call('ZADD', KEYS[1], e, m)
  else
    kept = kept + 1
  end
end
out[2] = kept
return out
