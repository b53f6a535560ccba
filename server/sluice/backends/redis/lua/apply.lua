-- The driver: KEYS = the state key of every limit of every hit, in order.
-- ARGV[1] = now in seconds as a decimal string, or '' for Redis's own clock (so instances
-- with skewed clocks agree); then the hits, in one of two forms:
-- * per hit: cost, k, and k times (algorithm, requests_per_unit, period_s, burst), which
--   the algorithms call L, P and b;
-- * compact (ARGV[2] = '#'): ARGV[3] = m, then m limits (algorithm, L, P, b) each once; then
--   per hit: cost, k, and k indexes (1..m) into those limits. Concurrent requests mostly
--   share a few limits, so a batch sends (and Redis reads and checks) each limit once.
-- Returns, per limit of every hit in order: allowed (0/1), remaining, reset_s and delay_s
-- (strings, '%.17g': Redis would truncate a non-integer Lua number), fits (0/1), below_limit
-- (a refused hit's part within the limit, for algorithms that count refused hits; else 0).
--
-- Lean by design (Redis's CPU per decision is what a shared Redis scales by): the arguments
-- are checked in one pass into flat arrays (no table per hit or per limit), and a hit with
-- one limit (the common case) is stepped and committed without the per-hit results table; a
-- lone fixed window (the commonest) in one step without any table or closure.

-- Check everything first: an error after a commit would leave the call half applied.
local argc = #ARGV
local hit_cost, hit_limits = {}, {} -- per hit
local fns, Ls, Ps, bs, counted = {}, {}, {}, {}, {} -- per limit, in KEYS order
local nhits, nlimits = 0, 0
local calendars = {} -- the calendar boundaries of the limits that have them

-- One limit's four arguments from ARGV[a], checked; nil and an error reply if bad.
local function limit_at(a)
  local name = ARGV[a]
  local fn = ALGORITHMS[name]
  local L, P, b = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2]), tonumber(ARGV[a + 3])
  if fn == nil then
    return nil, redis.error_reply('sluice: unknown algorithm ' .. tostring(name))
  end
  if P == nil and CALENDAR[name] then
    P = cal_parse(ARGV[a + 2]) -- calendar boundaries, checked against now once it is known
    calendars[#calendars + 1] = P
  end
  if L == nil or P == nil or b == nil or L < 0 or (type(P) == 'number' and P <= 0) or b < 0 then
    return nil, redis.error_reply('sluice: bad limit at ARGV[' .. a .. ']')
  end
  return { fn, L, P, b, COUNTS_REFUSED[name] or false }
end

local a = 2
local table_of -- the compact form's limits, else nil
if ARGV[2] == '#' then
  local m = tonumber(ARGV[3])
  if m == nil or m < 0 then
    return redis.error_reply('sluice: bad limit count at ARGV[3]')
  end
  table_of = {}
  a = 4
  for j = 1, m do
    local limit, err = limit_at(a)
    if limit == nil then
      return err
    end
    table_of[j] = limit
    a = a + 4
  end
end
while a <= argc do
  local cost, k = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  if cost == nil or k == nil or cost < 0 or k < 0 then
    return redis.error_reply('sluice: bad hit header at ARGV[' .. a .. ']')
  end
  a = a + 2
  nhits = nhits + 1
  hit_cost[nhits], hit_limits[nhits] = cost, k
  for _ = 1, k do
    local limit, err
    if table_of ~= nil then
      limit = table_of[tonumber(ARGV[a])]
      if limit == nil then
        return redis.error_reply('sluice: bad limit index at ARGV[' .. a .. ']')
      end
      a = a + 1
    else
      limit, err = limit_at(a)
      if limit == nil then
        return err
      end
      a = a + 4
    end
    nlimits = nlimits + 1
    fns[nlimits], Ls[nlimits], Ps[nlimits], bs[nlimits] = limit[1], limit[2], limit[3], limit[4]
    counted[nlimits] = limit[5]
  end
end
if nlimits ~= #KEYS then
  return redis.error_reply('sluice: ' .. #KEYS .. ' KEYS for ' .. nlimits .. ' limits')
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
-- Calendar boundaries are computed from the caller's clock: its window and one on either
-- side are all this clock may fall in (a skew of a whole window is a broken clock).
for j = 1, #calendars do
  local B = calendars[j]
  if B ~= nil and (now < B[3] or now >= B[6]) then
    return redis.error_reply('sluice: now ' .. fmt(now) .. ' is outside the calendar windows sent')
  end
end

local out = {}
local n = 0
local function emit(res)
  out[n + 1] = res.allowed and 1 or 0
  out[n + 2] = res.remaining
  out[n + 3] = res.reset == 0 and '0' or fmt(res.reset)
  out[n + 4] = res.delay == 0 and '0' or fmt(res.delay)
  out[n + 5] = res.fits and 1 or 0
  out[n + 6] = res.below or 0
  n = n + 6
end

local i = 1 -- the next limit (and key)
local results = {}
for h = 1, nhits do
  local cost, k = hit_cost[h], hit_limits[h]
  if k == 1 and fns[i] == ALGORITHMS['fixed_window'] then
    n = FIXED_WINDOW_ALONE(KEYS[i], now, Ls[i], Ps[i], cost, out, n)
    i = i + 1
  elseif k == 1 then
    local res = fns[i](KEYS[i], now, Ls[i], Ps[i], bs[i], cost)
    -- A refused hit changes nothing, except where refused hits count (fixed windows).
    if res.commit ~= nil and (res.allowed or counted[i]) then
      res.commit()
    end
    emit(res)
    i = i + 1
  elseif k > 1 then
    -- Step every limit before writing any: a hit is admitted only if all of them admit it.
    local admitted = true
    for j = 1, k do
      local res = fns[i + j - 1](KEYS[i + j - 1], now, Ls[i + j - 1], Ps[i + j - 1],
        bs[i + j - 1], cost)
      results[j] = res
      admitted = admitted and res.allowed
    end
    for j = 1, k do
      local res = results[j]
      if res.commit ~= nil and (admitted or counted[i + j - 1]) then
        res.commit()
      end
      emit(res)
    end
    i = i + k
  end
end
return out
