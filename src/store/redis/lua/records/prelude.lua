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
