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
