local v = redis.call('GET', KEYS[1])
if v then
  local s, t, f, a, l = parse(v)
  if s == 'in_progress' and tonumber(l) > tonumber(ARGV[2]) then return 2 end
  redis.call('DEL', KEYS[1])
  if s then unlist(ARGV[3], ARGV[1], s, t) else unlist_gone(ARGV[3], ARGV[1]) end
end
redis.call('ZREM', KEYS[2], ARGV[1])
if v then return 1 end
return 0
