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
