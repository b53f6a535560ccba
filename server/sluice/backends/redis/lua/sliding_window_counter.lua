-- sliding_window_counter: sluice/algorithms/sliding_window_counter.py. State: a hash,
-- w = window start, c = its count, p = the count of the window before it. P is the period,
-- or calendar boundaries (a table: see cal_parse), as Python's Spacing.
CALENDAR['sliding_window_counter'] = true
local function swc_window(t, P) -- exact, as in Python: see _window there
  return math.floor(t / P) * P
end

-- (start of the window before, start, length) of the window holding t
local function swc_window_of(P, t)
  if type(P) == 'table' then
    local i = cal_index(P, t)
    return P[i - 1], P[i], P[i + 1] - P[i]
  end
  local start = swc_window(t, P)
  return start - P, start, P
end

-- the length of the window that begins at stop
local function swc_next_length(P, stop)
  if type(P) == 'table' then
    local j = cal_index(P, stop)
    return P[j + 1] - P[j]
  end
  return P
end

-- (current, previous) as seen from the window beginning at start
local function swc_counts(w, c, p, start, before)
  if w == nil then
    return 0, 0
  end
  if w == start then
    return c, p
  end
  if w == before then
    return 0, c
  end
  return 0, 0
end

local function swc_estimate(previous, current, e, length)
  return previous * (length - e) / length + current
end

local function swc_estimate_at(w, c, p, P, x)
  local before, start, length = swc_window_of(P, x)
  local current, previous = swc_counts(w, c, p, start, before)
  return swc_estimate(previous, current, x - start, length)
end

local function swc_remaining(est, L)
  return largest(math.floor(L - est), function(k)
    return est + k <= L
  end)
end

-- every state holds a hit of its own window (c >= 1): it counts until the window after ends
local function swc_expires_at(w, P)
  if type(P) == 'table' then
    local j = cal_index(P, w)
    if P[j] ~= w then
      return w
    end
    return P[j + 2]
  end
  return w + 2 * P
end

local function swc_earliest(previous, current, start, length, next_length, room)
  local left = room - current
  if left > 0 and previous > 0 then
    return start + (length - left * length / previous)
  end
  if current <= room then
    return start + length
  end
  if room > 0 then
    return start + length + (next_length - room * next_length / current)
  end
  return start + length + next_length
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
  local before, start, length = swc_window_of(P, t)
  local e = t - start
  local current, previous = swc_counts(w, c, p, start, before)
  local est = swc_estimate(previous, current, e, length)
  if cost > L then
    return result(false, swc_remaining(est, L), 0, 0, false, nil)
  end
  if cost == 0 then
    local untl = 0
    if w ~= nil then
      untl = math.max(swc_expires_at(w, P) - t, 0)
    end
    return result(true, swc_remaining(est, L), untl, 0, true, nil)
  end
  if est + cost <= L then
    local after = swc_estimate(previous, current + cost, e, length)
    local expires = swc_expires_at(start, P)
    local commit = function()
      redis.call('HSET', key, 'w', fmt(start), 'c', int(current + cost), 'p', int(previous))
      redis.call('PEXPIRE', key, ttl_ms(expires, now))
    end
    return result(true, swc_remaining(after, L), expires - t, 0, true, commit)
  end
  local next_length = swc_next_length(P, start + length)
  local at = swc_earliest(previous, current, start, length, next_length, L - cost)
  local reset = settle(t, at - t, function(x)
    return swc_estimate_at(w, c, p, P, x) + cost <= L
  end)
  return result(false, swc_remaining(est, L), reset, 0, true, nil)
end
