-- table.renew. ARGV[2]: lease id, ARGV[3]: ttl_s. Reply: 1 renewed, 0 not held.
if not redis.call('ZSCORE', key, ARGV[2]) then
  return 0
end
redis.call('ZADD', key, 'XX', fmt(now + tonumber(ARGV[3])), ARGV[2])
keep_until_last()
return 1
