-- Shared by the algorithm files that follow (the script is prelude, the six algorithms,
-- then apply.lua, concatenated). Every formula mirrors sluice/algorithms operation for
-- operation: Lua numbers are doubles like Python floats, so the same order of operations
-- gives bit-identical results.

-- name -> function(key, now, L, P, b, n) returning a result table:
--   allowed, remaining, reset, delay, fits (booleans / numbers), below (optional: a refused
--   hit's part within the limit, Outcome.below_limit), and commit: nil when the
--   state must not change, else a function writing the new state and its TTL. Algorithms
--   only read; the driver decides which commits run.
local ALGORITHMS = {}
-- name -> true for the algorithms whose refused hits change state too (the Python trait
-- Algorithm.counts_refused); each algorithm's own file says so.
local COUNTS_REFUSED = {}
-- name -> true for the algorithms whose windows can follow a calendar (the Python trait
-- Algorithm.calendar_windows); for them P may be calendar boundaries (see cal_parse).
local CALENDAR = {}
-- fixed_window.lua's step-and-commit for a hit with that one limit (see there).
local FIXED_WINDOW_ALONE

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

-- Calendar windows (sluice/algorithms/calendar.py): P is then the SPAN window boundaries
-- around the caller's now, sent as 'b1,b2,...' in place of a period. nil if malformed.
local CAL_SPAN = 8
local function cal_parse(text)
  if type(text) ~= 'string' then
    return nil
  end
  local B = {}
  for part in string.gmatch(text, '[^,]+') do
    local b = tonumber(part)
    if b == nil or (#B > 0 and b <= B[#B]) then
      return nil
    end
    B[#B + 1] = b
  end
  if #B ~= CAL_SPAN then
    return nil
  end
  return B
end

-- sluice.algorithms.calendar.window_index, 1-based: i with B[i] <= t < B[i + 1], from 2 to
-- #B - 1 so the window before is known too.
local function cal_index(B, t)
  local i = 2
  local last = #B - 1
  while i < last and B[i + 1] <= t do
    i = i + 1
  end
  return i
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

-- sluice.algorithms._schedule: a schedule is (base, k), busy until base + k * T (k a whole
-- number of cells), or nil for none; schedule returns the result and the new schedule to
-- store (nil: leave the state alone) with its expiry.
local FOLD_CELLS = 2 ^ 40

local function schedule_in_force(base, k, t, interval)
  if base == nil then
    return t, 0
  end
  if (base - t) + k * interval <= 0 then
    return t, 0
  end
  return base, k
end

local function schedule_remaining(base0, k0, t, interval, b)
  local base, k = schedule_in_force(base0, k0, t, interval)
  return largest(math.floor((t - base) / interval) + b - k, function(n)
    return (base - t) + (k + n - b) * interval <= 0
  end)
end

local function schedule_expires(base, k, interval)
  return base + settle(base, k * interval, function(x)
    return (base - x) + k * interval <= 0
  end)
end

local function schedule(base0, k0, L, P, b, t, cost)
  if L == 0 then
    return refuse_all(), nil
  end
  local interval = P / L
  if cost > b then
    return result(false, schedule_remaining(base0, k0, t, interval, b), 0, 0, false, nil), nil
  end
  local base, k = schedule_in_force(base0, k0, t, interval)
  local wait = (base - t) + k * interval
  if cost == 0 then
    local untl = 0
    if wait > 0 then
      untl = schedule_expires(base, k, interval) - t
    end
    return result(true, schedule_remaining(base0, k0, t, interval, b), untl, 0, true, nil), nil
  end
  local short = (base - t) + (k + cost - b) * interval
  if short <= 0 then
    local nb, nk = base, k + cost
    if nk >= FOLD_CELLS then
      nb, nk = schedule_expires(nb, nk, interval), 0
    end
    local remaining = schedule_remaining(nb, nk, t, interval, b)
    local expires = schedule_expires(nb, nk, interval)
    return result(true, remaining, expires - t, wait, true, nil), { nb, nk, expires }
  end
  local reset = settle(t, short, function(x)
    local xb, xk = schedule_in_force(base0, k0, x, interval)
    return (xb - x) + (xk + cost - b) * interval <= 0
  end)
  return result(false, schedule_remaining(base0, k0, t, interval, b), reset, 0, true, nil), nil
end

-- The state of gcra and leaky_bucket: a string '<at>\0<base>\0<k>' (at = base + k * T,
-- rounded up as expires_at is). Instances from before k was counted stored at alone, and
-- read this one as at alone too: Lua 5.1's tonumber stops at the first NUL. So either
-- version reads the other's keys (an old value is base = at, k = 0) and a rolling upgrade
-- neither loses state nor over-admits.
local function schedule_read(stored)
  if not stored then
    return nil, nil
  end
  local first = string.find(stored, '\0', 1, true)
  if first == nil then
    return tonumber(stored), 0
  end
  local second = string.find(stored, '\0', first + 1, true)
  if second == nil then
    return nil, nil
  end
  local base = tonumber(string.sub(stored, first + 1, second - 1))
  return base, tonumber(string.sub(stored, second + 1))
end

local function schedule_step(key, now, L, P, b, cost)
  local base, k = schedule_read(redis.call('GET', key))
  if base == nil or k == nil then
    base, k = nil, nil
  end
  local res, new = schedule(base, k, L, P, b, now, cost)
  if new ~= nil then
    res.commit = function()
      local value = fmt(new[3]) .. '\0' .. fmt(new[1]) .. '\0' .. fmt(new[2])
      redis.call('SET', key, value, 'PX', ttl_ms(new[3], now))
    end
  end
  return res
end
