if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  redis.call('ZADD', KEYS[2], ARGV[7], ARGV[3])
  redis.call('ZADD', KEYS[3], ARGV[6], ARGV[10])
  return 0
end
