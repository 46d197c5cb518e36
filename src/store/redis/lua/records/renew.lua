local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local s, t, f, a, l, c, x, e, u, h = parse(v)
if s ~= 'in_progress' or t ~= ARGV[2] then return 0 end
local ne = e
if tonumber(ARGV[4]) > tonumber(e) then ne = ARGV[4] end
local nv = table.concat({s, t, f, a, ARGV[3], c, x, ne, u, h}, '|')
local pttl = redis.call('PTTL', KEYS[1])
if pttl >= 0 then
  local left = pttl + math.max(tonumber(ne), tonumber(ARGV[3])) - math.max(tonumber(e), tonumber(l))
  redis.call('SET', KEYS[1], nv, 'PX', string.format('%d', math.max(left, 1)))
else
  redis.call('SET', KEYS[1], nv, 'KEEPTTL')
end
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
return nv
