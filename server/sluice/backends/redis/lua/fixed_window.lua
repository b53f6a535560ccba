-- fixed_window: sluice/algorithms/fixed_window.py, envoyproxy/ratelimit semantics: windows
-- aligned to the epoch on whole seconds, every hit counted (refused ones too: COUNTS_REFUSED
-- makes the driver commit them). State: a hash, w = window start, c = its count.
-- The commit writes the stepped count (inside the atomic script) rather than HINCRBY, so two
-- limits sharing a key in one hit end as in the memory backend. The key's expiry is set when
-- a window starts in it (the key was missing, or held an older window): later hits in the
-- window would set the same expiry again (start + P on Redis's clock), so they write only c.
-- A refused hit reports below: the part of its cost that still fell within the limit.
-- The reset is exact (the limiter rounds it up to whole seconds on the wire, as
-- envoyproxy/ratelimit). With calendar boundaries for P, the window is the calendar window
-- holding now.
-- The window holding now: [start, stop), epoch-aligned on whole seconds, or the calendar's.
local function fixed_window_bounds(now, P)
  if type(P) == 'table' then
    local i = cal_index(P, now)
    return P[i], P[i + 1]
  end
  local now_s = math.floor(now)
  local start = now_s - now_s % P
  return start, start + P
end

COUNTS_REFUSED['fixed_window'] = true
CALENDAR['fixed_window'] = true
ALGORITHMS['fixed_window'] = function(key, now, L, P, b, cost)
  local start, stop = fixed_window_bounds(now, P)
  local stored = redis.call('HMGET', key, 'w', 'c')
  local count = 0
  local same = stored[1] and tonumber(stored[1]) == start
  if same then
    count = tonumber(stored[2])
  end
  count = count + cost
  local allowed = count <= L
  local remaining = 0
  if allowed then
    remaining = L - count
  end
  local commit
  local below = 0
  if not allowed and L - (count - cost) > 0 then
    below = L - (count - cost)
  end
  if same then
    commit = function()
      redis.call('HSET', key, 'c', int(count))
    end
  else
    commit = function()
      redis.call('HSET', key, 'w', int(start), 'c', int(count))
      redis.call('PEXPIRE', key, ttl_ms(stop, now))
    end
  end
  local res = result(allowed, remaining, stop - now, 0, cost <= L, commit)
  res.below = below
  return res
end

-- The same step and commit in one, for a hit whose only limit is a fixed window (the driver
-- calls it then: a fixed window commits whether or not it admits, and no other limit of the
-- hit can share its key). No result table and no closure: it writes the reply's six values
-- into out at n and returns the new n. Same formulas, same state, same reply.
FIXED_WINDOW_ALONE = function(key, now, L, P, cost, out, n)
  local start, stop = fixed_window_bounds(now, P)
  local stored = redis.call('HMGET', key, 'w', 'c')
  local count = cost
  if stored[1] and tonumber(stored[1]) == start then
    count = tonumber(stored[2]) + cost
    redis.call('HSET', key, 'c', int(count))
  else
    redis.call('HSET', key, 'w', int(start), 'c', int(count))
    redis.call('PEXPIRE', key, ttl_ms(stop, now))
  end
  local below = 0
  if count <= L then
    out[n + 1] = 1
    out[n + 2] = L - count
  else
    out[n + 1] = 0
    out[n + 2] = 0
    if L - (count - cost) > 0 then
      below = L - (count - cost)
    end
  end
  local reset = stop - now
  out[n + 3] = reset == 0 and '0' or fmt(reset)
  out[n + 4] = '0'
  out[n + 5] = cost <= L and 1 or 0
  out[n + 6] = below
  return n + 6
end
