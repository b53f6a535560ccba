-- gcra: sluice/algorithms/gcra.py. State: the schedule string (see schedule_read) of TAT.
ALGORITHMS['gcra'] = function(key, now, L, P, b, cost)
  local res = schedule_step(key, now, L, P, b, cost)
  res.delay = 0 -- a policer: admitted hits proceed now
  return res
end
