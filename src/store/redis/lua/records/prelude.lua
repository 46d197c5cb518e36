local function int(x)
  return string.find(x, '^%-?%d+$') ~= nil
end
local function parse(v)
  local s, t, f, a, l, c, x, e, u, h = string.match(v, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|([^|]*)|(.*)$')
  if not (s and int(a) and int(l) and int(c) and int(x) and int(e) and int(u)) then return end
  return s, t, f, a, l, c, x, e, u, h
end
local function ttl(due, now)
  return string.format('%d', math.max(due - now, 1))
end
-- The listing indexes (see `listing.rs`): `<lp><state>:<namespace>`, a sorted set
-- per shard, namespace and state scored by updated_at; members are ids, and
-- `<id>\0<token>` in `in_progress`.
local function split(m)
  local at = string.find(m, '\0', 1, true)
  if not at then return '', m end
  return string.sub(m, 1, at - 1), string.sub(m, at + 1)
end
local function unlist(lp, m, s, t)
  local ns, id = split(m)
  if s == 'in_progress' then
    redis.call('ZREM', lp .. 'in_progress:' .. ns, id .. '\0' .. t)
  else
    redis.call('ZREM', lp .. s .. ':' .. ns, id)
  end
end
-- A record that is gone: its entries in the finished states' indexes (an
-- `in_progress` entry names a token no longer known: the listing drops it).
local function unlist_gone(lp, m)
  local ns, id = split(m)
  for _, s in ipairs({'completed', 'failed', 'escalated', 'permanent_failure'}) do
    redis.call('ZREM', lp .. s .. ':' .. ns, id)
  end
end
