"""Token bucket: capacity ``b``, refilled at ``L / P`` tokens per second.

Tokens are kept fractional, so rates below one per second never starve; a new key starts
full. A hit of cost ``n`` is admitted iff at least ``n`` tokens are there. State is
``(tokens, updated_at)``; a clock that steps back refills nothing rather than draining.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sluice.algorithms._exact import settle
from sluice.algorithms.base import Algorithm, Limit, Outcome

__all__ = ["ALGORITHM", "BucketState", "expires_at", "step"]


@dataclass(frozen=True, slots=True)
class BucketState:
    tokens: float
    updated_at: float


def _fill(state: BucketState | None, limit: Limit, t: float) -> tuple[float, float]:
    """(tokens, as of when) at ``t``."""
    if state is None:
        return float(limit.burst), t
    at = max(state.updated_at, t)
    refill = (at - state.updated_at) * limit.requests_per_unit / limit.period_s
    return min(float(limit.burst), state.tokens + refill), at


def step(
    state: BucketState | None, limit: Limit, now: float, cost: int
) -> tuple[BucketState | None, Outcome]:
    t = float(now)
    rate, period = limit.requests_per_unit, limit.period_s
    if rate == 0:
        return state, Outcome(False, 0, 0.0, fits=False)
    tokens, at = _fill(state, limit, t)
    if cost > limit.burst:
        return state, Outcome(False, math.floor(tokens), 0.0, fits=False)
    if cost == 0:
        until = max(expires_at(state, limit) - t, 0.0) if state is not None else 0.0
        return state, Outcome(True, math.floor(tokens), until)
    if tokens >= cost:
        new = BucketState(tokens - cost, at)
        return new, Outcome(True, math.floor(tokens - cost), expires_at(new, limit) - t)
    wait = (cost - tokens) * period / rate
    reset = settle(t, wait, lambda x: _fill(state, limit, x)[0] >= cost)
    return state, Outcome(False, math.floor(tokens), reset)


def expires_at(state: BucketState, limit: Limit) -> float:
    """When the bucket is full again (checked, so from then on it is exactly like None)."""
    u = state.updated_at
    wait = (limit.burst - state.tokens) * limit.period_s / limit.requests_per_unit
    return u + settle(u, wait, lambda x: _fill(state, limit, x)[0] >= limit.burst)


ALGORITHM: Algorithm = Algorithm("token_bucket", step, expires_at, takes_burst=True)
