-- The Redis script as instances before the lean driver and fixed window ran it (commit
-- b5c1619: every fixed-window hit set the key's expiry): test_algorithm_scripts.py plays
-- such an old instance in a rolling upgrade. Frozen on purpose: do not update it along
-- with the real script.
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

-- fixed_window.lua
-- fixed_window: sluice/algorithms/fixed_window.py, envoyproxy/ratelimit semantics: windows
-- aligned to the epoch on whole seconds, every hit counted (refused ones too: COUNTS_REFUSED
-- makes the driver commit them). State: a hash, w = window start, c = its count.
-- The commit writes the stepped count (INCRBY inside the atomic script) rather than
-- HINCRBY, so two limits sharing a key in one hit end as in the memory backend. The reset is
-- exact (the limiter rounds it up to whole seconds on the wire, as envoyproxy/ratelimit).
COUNTS_REFUSED['fixed_window'] = true
ALGORITHMS['fixed_window'] = function(key, now, L, P, b, cost)
  local now_s = math.floor(now)
  local start = now_s - now_s % P
  local stored = redis.call('HMGET', key, 'w', 'c')
  local count = 0
  if stored[1] and tonumber(stored[1]) == start then
    count = tonumber(stored[2])
  end
  count = count + cost
  local allowed = count <= L
  local remaining = 0
  if allowed then
    remaining = L - count
  end
  local commit = function()
    redis.call('HSET', key, 'w', int(start), 'c', int(count))
    redis.call('PEXPIRE', key, ttl_ms(start + P, now))
  end
  return result(allowed, remaining, start + P - now, 0, cost <= L, commit)
end

-- sliding_window_log.lua
-- sliding_window_log: sluice/algorithms/sliding_window_log.py. State: a sorted set, score =
-- timestamp, member = '<timestamp>:<cost>' (one member per timestamp). An entry is live
-- while ts + P > now; dead entries are a prefix, removed by score when a hit commits (by
-- score, not rank, so a second commit to the same key in one hit removes nothing more).
ALGORITHMS['sliding_window_log'] = function(key, now, L, P, b, cost)
  if L == 0 then
    return refuse_all()
  end
  local t = now
  local raw = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  local stamps, costs, members = {}, {}, {}
  for i = 1, #raw, 2 do
    local j = #stamps + 1
    members[j] = raw[i]
    stamps[j] = tonumber(raw[i + 1])
    costs[j] = tonumber(string.match(raw[i], ':(%d+)$'))
  end
  local function used_at(x)
    local used = 0
    for j = 1, #stamps do
      if stamps[j] + P > x then
        used = used + costs[j]
      end
    end
    return used
  end
  local dead = 0
  while dead < #stamps and not (stamps[dead + 1] + P > t) do
    dead = dead + 1
  end
  local used = used_at(t)
  local remaining = math.max(L - used, 0)
  if cost > L then
    return result(false, remaining, 0, 0, false, nil)
  end
  if cost == 0 then
    local untl = 0
    if #stamps > 0 then
      untl = math.max((stamps[#stamps] + P) - t, 0)
    end
    return result(true, remaining, untl, 0, true, nil)
  end
  if used + cost <= L then
    local merged, merged_cost = nil, cost
    for j = dead + 1, #stamps do
      if stamps[j] == t then
        merged, merged_cost = members[j], costs[j] + cost
      end
    end
    local newest = t
    if #stamps > dead and stamps[#stamps] > t then
      newest = stamps[#stamps]
    end
    local expires = newest + P
    local commit = function()
      if dead > 0 then
        redis.call('ZREMRANGEBYSCORE', key, '-inf', fmt(stamps[dead]))
      end
      if merged then
        redis.call('ZREM', key, merged)
      end
      redis.call('ZADD', key, fmt(t), fmt(t) .. ':' .. int(merged_cost))
      redis.call('PEXPIRE', key, ttl_ms(expires, now))
    end
    return result(true, L - used - cost, expires - t, 0, true, commit)
  end
  -- The oldest live entries must age out until enough room is free.
  local need = used + cost - L
  local freed = 0
  local at = t
  for j = dead + 1, #stamps do
    freed = freed + costs[j]
    if freed >= need then
      at = stamps[j] + P
      break
    end
  end
  local reset = settle(t, at - t, function(x)
    return used_at(x) + cost <= L
  end)
  return result(false, remaining, reset, 0, true, nil)
end

-- sliding_window_counter.lua
-- sliding_window_counter: sluice/algorithms/sliding_window_counter.py. State: a hash,
-- w = window start, c = its count, p = the count of the window before it.
local function swc_window(t, P) -- exact, as in Python: see _window there
  return math.floor(t / P) * P
end

-- (current, previous) as seen from the window beginning at start
local function swc_counts(w, c, p, start, P)
  if w == nil then
    return 0, 0
  end
  if w == start then
    return c, p
  end
  if w == start - P then
    return 0, c
  end
  return 0, 0
end

local function swc_estimate(previous, current, e, P)
  return previous * (P - e) / P + current
end

local function swc_estimate_at(w, c, p, P, x)
  local start = swc_window(x, P)
  local current, previous = swc_counts(w, c, p, start, P)
  return swc_estimate(previous, current, x - start, P)
end

local function swc_remaining(est, L)
  return largest(math.floor(L - est), function(k)
    return est + k <= L
  end)
end

local function swc_expires_at(w, c, p, P)
  if c > 0 then
    return w + 2 * P
  end
  if p > 0 then
    return w + P
  end
  return w
end

local function swc_earliest(previous, current, start, L, P, cost)
  local room = L - cost - current
  if room > 0 and previous > 0 then
    return start + (P - room * P / previous)
  end
  room = L - cost
  if current <= room then
    return start + P
  end
  if room > 0 then
    return start + P + (P - room * P / current)
  end
  return start + 2 * P
end

ALGORITHMS['sliding_window_counter'] = function(key, now, L, P, b, cost)
  if L == 0 then
    return refuse_all()
  end
  local t = now
  local stored = redis.call('HMGET', key, 'w', 'c', 'p')
  local w, c, p = nil, nil, nil
  if stored[1] then
    w, c, p = tonumber(stored[1]), tonumber(stored[2]), tonumber(stored[3])
  end
  local start = swc_window(t, P)
  local e = t - start
  local current, previous = swc_counts(w, c, p, start, P)
  local est = swc_estimate(previous, current, e, P)
  if cost > L then
    return result(false, swc_remaining(est, L), 0, 0, false, nil)
  end
  if cost == 0 then
    local untl = 0
    if w ~= nil then
      untl = math.max(swc_expires_at(w, c, p, P) - t, 0)
    end
    return result(true, swc_remaining(est, L), untl, 0, true, nil)
  end
  if est + cost <= L then
    local after = swc_estimate(previous, current + cost, e, P)
    local expires = swc_expires_at(start, current + cost, previous, P)
    local commit = function()
      redis.call('HSET', key, 'w', fmt(start), 'c', int(current + cost), 'p', int(previous))
      redis.call('PEXPIRE', key, ttl_ms(expires, now))
    end
    return result(true, swc_remaining(after, L), expires - t, 0, true, commit)
  end
  local at = swc_earliest(previous, current, start, L, P, cost)
  local reset = settle(t, at - t, function(x)
    return swc_estimate_at(w, c, p, P, x) + cost <= L
  end)
  return result(false, swc_remaining(est, L), reset, 0, true, nil)
end

-- token_bucket.lua
-- token_bucket: sluice/algorithms/token_bucket.py. State: a hash, tk = tokens (fractional),
-- at = when they were counted. A missing key is a full bucket.
local function tb_fill(tokens, updated_at, L, P, b, t)
  if tokens == nil then
    return b, t
  end
  local at = math.max(updated_at, t)
  local refill = (at - updated_at) * L / P
  return math.min(b, tokens + refill), at
end

local function tb_expires_at(tokens, updated_at, L, P, b)
  local wait = (b - tokens) * P / L
  return updated_at + settle(updated_at, wait, function(x)
    local full = tb_fill(tokens, updated_at, L, P, b, x)
    return full >= b
  end)
end

ALGORITHMS['token_bucket'] = function(key, now, L, P, b, cost)
  if L == 0 then
    return refuse_all()
  end
  local stored = redis.call('HMGET', key, 'tk', 'at')
  local old_tokens, old_at = nil, nil
  if stored[1] then
    old_tokens, old_at = tonumber(stored[1]), tonumber(stored[2])
  end
  local t = now
  local tokens, at = tb_fill(old_tokens, old_at, L, P, b, t)
  if cost > b then
    return result(false, math.floor(tokens), 0, 0, false, nil)
  end
  if cost == 0 then
    local untl = 0
    if old_tokens ~= nil then
      untl = math.max(tb_expires_at(old_tokens, old_at, L, P, b) - t, 0)
    end
    return result(true, math.floor(tokens), untl, 0, true, nil)
  end
  if tokens >= cost then
    local left = tokens - cost
    local expires = tb_expires_at(left, at, L, P, b)
    local commit = function()
      redis.call('HSET', key, 'tk', fmt(left), 'at', fmt(at))
      redis.call('PEXPIRE', key, ttl_ms(expires, now))
    end
    return result(true, math.floor(left), expires - t, 0, true, commit)
  end
  local wait = (cost - tokens) * P / L
  local reset = settle(t, wait, function(x)
    local available = tb_fill(old_tokens, old_at, L, P, b, x)
    return available >= cost
  end)
  return result(false, math.floor(tokens), reset, 0, true, nil)
end

-- leaky_bucket.lua
-- leaky_bucket: sluice/algorithms/leaky_bucket.py. State: the schedule string (see
-- schedule_read) of free_at, when the queue drains. Admits exactly like gcra but reports each
-- hit's wait as its delay.
ALGORITHMS['leaky_bucket'] = function(key, now, L, P, b, cost)
  return schedule_step(key, now, L, P, b, cost)
end

-- gcra.lua
-- gcra: sluice/algorithms/gcra.py. State: the schedule string (see schedule_read) of TAT.
ALGORITHMS['gcra'] = function(key, now, L, P, b, cost)
  local res = schedule_step(key, now, L, P, b, cost)
  res.delay = 0 -- a policer: admitted hits proceed now
  return res
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
