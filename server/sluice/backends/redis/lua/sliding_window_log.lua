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
