-- Shared by every lease script (prelude.lua, then one operation's file, concatenated):
-- each mirrors sluice/leases/table.py operation for operation.
-- KEYS[1]: the descriptor's sorted set, lease id -> expires_at (seconds).
-- ARGV[1]: now in seconds as a decimal string, or '' for Redis's own clock (so instances
-- whose clocks differ agree on what has expired).
local key = KEYS[1]

local function fmt(x)
  return string.format('%.17g', x)
end

local now
if ARGV[1] == '' then
  local clock = redis.call('TIME')
  now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
else
  now = tonumber(ARGV[1])
  if now == nil then
    return redis.error_reply('sluice: bad now ' .. tostring(ARGV[1]))
  end
end

-- table.prune: a lease is held while now < expires_at.
redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(now))

-- table._next_expiry: seconds until the first held lease expires, 0 when none is held.
local function next_expiry()
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  if first[2] then
    return tonumber(first[2]) - now
  end
  return 0
end

-- The key lives as long as its last lease (plus a second of slack for callers whose `now`
-- lags Redis's clock), so an abandoned table disappears by itself. Relative, so a caller's
-- clock that is not Redis's cannot make it expire early.
local function keep_until_last()
  local last = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  if last[2] then
    redis.call('PEXPIRE', key, math.ceil((tonumber(last[2]) - now) * 1000) + 1000)
  end
end
