-- leaky_bucket: sluice/algorithms/leaky_bucket.py. State: the schedule string (see
-- schedule_read) of free_at, when the queue drains. Admits exactly like gcra but reports each
-- hit's wait as its delay.
ALGORITHMS['leaky_bucket'] = function(key, now, L, P, b, cost)
  return schedule_step(key, now, L, P, b, cost)
end
