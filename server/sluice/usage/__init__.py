"""Usage telemetry: what every rule is doing, counted in memory on the request path and
flushed to a shared store off it, so all instances' figures add up."""
