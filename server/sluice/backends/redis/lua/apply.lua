-- The driver: KEYS = the state key of every limit of every hit, in order.
-- ARGV[1] = now in seconds as a decimal string, or '' for Redis's own clock (so instances
-- with skewed clocks agree); then per hit: cost, k, and k times (algorithm,
-- requests_per_unit, period_s, burst), which the algorithms call L, P and b.
-- Returns, per limit of every hit in order: allowed (0/1), remaining, reset_s and delay_s
-- (strings, '%.17g': Redis would truncate a non-integer Lua number), fits (0/1).

-- Parse everything first: an error after a commit would leave the call half applied.
local hits = {}
local limit_count = 0
local a = 2
while a <= #ARGV do
  local cost, k = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  if cost == nil or k == nil or cost < 0 or k < 0 then
    return redis.error_reply('sluice: bad hit header at ARGV[' .. a .. ']')
  end
  a = a + 2
  local limits = {}
  for j = 1, k do
    local name = ARGV[a]
    local L, P, b = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
    if ALGORITHMS[name] == nil then
      return redis.error_reply('sluice: unknown algorithm ' .. tostring(name))
    end
    if L == nil or P == nil or b == nil or L < 0 or P <= 0 or b < 0 then
      return redis.error_reply('sluice: bad limit at ARGV[' .. a .. ']')
    end
    limits[j] = { name = name, L = L, P = P, b = b }
    a = a + 4
  end
  hits[#hits + 1] = { cost = cost, limits = limits }
  limit_count = limit_count + k
end
if limit_count ~= #KEYS then
  return redis.error_reply('sluice: ' .. #KEYS .. ' KEYS for ' .. limit_count .. ' limits')
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

local out = {}
local next_key = 1
for _, hit in ipairs(hits) do
  -- Step every limit before writing any: a hit is admitted only if all of them admit it.
  local results = {}
  local admitted = true
  for j, limit in ipairs(hit.limits) do
    local res = ALGORITHMS[limit.name](KEYS[next_key], now, limit.L, limit.P, limit.b, hit.cost)
    results[j] = res
    admitted = admitted and res.allowed
    next_key = next_key + 1
  end
  for j, res in ipairs(results) do
    -- A refused hit changes nothing, except where refused hits count (fixed windows).
    if res.commit ~= nil and (admitted or COUNTS_REFUSED[hit.limits[j].name]) then
      res.commit()
    end
    local n = #out
    out[n + 1] = res.allowed and 1 or 0
    out[n + 2] = res.remaining
    out[n + 3] = fmt(res.reset)
    out[n + 4] = fmt(res.delay)
    out[n + 5] = res.fits and 1 or 0
  end
end
return out
