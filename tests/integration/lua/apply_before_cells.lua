-- The Redis script as instances before counted cells ran it (commit c13452b), reduced to
-- gcra and leaky_bucket: test_algorithm_scripts.py plays such an old instance in a rolling
-- upgrade. Frozen on purpose: do not update it along with the real script.
-- prelude.lua
-- Shared by the algorithm files that follow (the script is prelude, the six algorithms,
-- then apply.lua, concatenated). Every formula mirrors sluice/algorithms operation for
-- operation: Lua numbers are doubles like Python floats, so the same order of operations
-- gives bit-identical results.

-- name -> function(key, now, L, P, b, n) returning a result table:
--   allowed, remaining, reset, delay, fits (booleans / numbers), and commit: nil when the
--   state must not change, else a function writing the new state and its TTL. Algorithms
--   only read; the driver decides which commits run.
local ALGORITHMS = {}
-- name -> true for the algorithms whose refused hits change state too (the Python trait
-- Algorithm.counts_refused); each algorithm's own file says so.
local COUNTS_REFUSED = {}

local EPS = 2.220446049250313e-16 -- 2^-52, as in sluice.algorithms._exact
local MAX_NUDGES = 200
-- Redis expires keys on its own clock. The slack keeps a key a second past expires_at,
-- which is harmless (from expires_at on a state acts exactly like a missing key) and covers
-- callers whose explicit `now` lags Redis's clock.
local TTL_SLACK_MS = 1000

local function fmt(x)
  return string.format('%.17g', x)
end

local function int(x)
  return string.format('%d', x)
end

-- sluice.algorithms._exact.settle
local function settle(t, r, admits)
  if r < 0 then
    r = 0
  end
  local d = math.max(math.abs(t + r), 1) * EPS
  for _ = 1, MAX_NUDGES do
    if admits(t + r) then
      return r
    end
    r = r + d
    d = d * 2
  end
  return r
end

-- sluice.algorithms._exact.largest
local function largest(k, fits)
  if k < 0 then
    k = 0
  end
  while k > 0 and not fits(k) do
    k = k - 1
  end
  while fits(k + 1) do
    k = k + 1
  end
  return k
end

local function ttl_ms(expires_at, now)
  return int(math.max(math.ceil((expires_at - now) * 1000), 1) + TTL_SLACK_MS)
end

local function result(allowed, remaining, reset, delay, fits, commit)
  return {
    allowed = allowed, remaining = remaining, reset = reset, delay = delay, fits = fits,
    commit = commit,
  }
end

local function refuse_all()
  return result(false, 0, 0, 0, false, nil)
end

-- sluice.algorithms._schedule.schedule: at is the stored time or nil; returns the result
-- and the new time to store (nil: leave the state alone).
local function schedule_start(at, t)
  if at == nil then
    return t
  end
  return math.max(at, t)
end

local function schedule_remaining(at, t, interval, tau)
  local wait = schedule_start(at, t) - t
  return largest(math.floor((tau - wait) / interval), function(k)
    return wait + k * interval <= tau
  end)
end

local function schedule(at, L, P, b, t, cost)
  if L == 0 then
    return refuse_all(), nil
  end
  local interval = P / L
  local tau = interval * b
  if cost > b then
    return result(false, schedule_remaining(at, t, interval, tau), 0, 0, false, nil), nil
  end
  if cost == 0 then
    local untl = 0
    if at ~= nil then
      untl = math.max(at - t, 0)
    end
    return result(true, schedule_remaining(at, t, interval, tau), untl, 0, true, nil), nil
  end
  local start = schedule_start(at, t)
  local wait = start - t
  if wait + cost * interval <= tau then
    local new = start + cost * interval
    local remaining = schedule_remaining(new, t, interval, tau)
    return result(true, remaining, new - t, wait, true, nil), new
  end
  local need = cost * interval
  local reset = settle(t, wait - (tau - need), function(x)
    return (schedule_start(at, x) - x) + need <= tau
  end)
  return result(false, schedule_remaining(at, t, interval, tau), reset, 0, true, nil), nil
end

-- The one-number state of gcra and leaky_bucket.
local function schedule_step(key, now, L, P, b, cost)
  local stored = redis.call('GET', key)
  local at = nil
  if stored then
    at = tonumber(stored)
  end
  local res, new = schedule(at, L, P, b, now, cost)
  if new ~= nil then
    res.commit = function()
      redis.call('SET', key, fmt(new), 'PX', ttl_ms(new, now))
    end
  end
  return res
end
-- gcra.lua
-- gcra: sluice/algorithms/gcra.py. State: a string holding TAT.
ALGORITHMS['gcra'] = function(key, now, L, P, b, cost)
  local res = schedule_step(key, now, L, P, b, cost)
  res.delay = 0 -- a policer: admitted hits proceed now
  return res
end
-- leaky_bucket.lua
-- leaky_bucket: sluice/algorithms/leaky_bucket.py. State: a string holding free_at, when
-- the queue drains. Admits exactly like gcra but reports each hit's wait as its delay.
ALGORITHMS['leaky_bucket'] = function(key, now, L, P, b, cost)
  return schedule_step(key, now, L, P, b, cost)
end
-- apply.lua
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
