-- table.release. ARGV[2]: lease id. Reply: 1 released, 0 not held. (Redis deletes the key
-- with its last member.)
return redis.call('ZREM', key, ARGV[2])
