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
