-- table.acquire. ARGV[2]: lease id, ARGV[3]: max_leases, ARGV[4]: ttl_s.
-- Reply: {granted (0/1), in_flight, retry_after_s as a decimal string}.
local held = redis.call('ZCARD', key)
if held >= tonumber(ARGV[3]) then
  return {0, held, fmt(next_expiry())}
end
redis.call('ZADD', key, fmt(now + tonumber(ARGV[4])), ARGV[2])
keep_until_last()
return {1, held + 1, '0'}
