-- fixed_window.lua as instances before it set the expiry once per window ran it (commit
-- b5c1619): test_algorithm_scripts.py plays such an old instance in a rolling upgrade.
-- Frozen on purpose: do not update it along with the real script.
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
