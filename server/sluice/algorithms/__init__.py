"""Rate-limit algorithms as pure step functions.

Each algorithm is one module with the same two functions:

    step(state, limit, now, cost) -> (new_state, outcome)
    expires_at(state, limit) -> float   # from then on the state is equivalent to None

``state`` is None for a key never seen (or expired). A rejected hit returns the old state
unchanged (the same object), except in ``fixed_window``, which counts every hit as
envoyproxy/ratelimit does. They never touch storage or clocks, so the memory backend, the
Redis scripts' differential tests and the what-if tooling share one definition of each.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ALGORITHMS", "Limit", "Outcome"]

ALGORITHMS = (
    "fixed_window",
    "sliding_window_log",
    "sliding_window_counter",
    "token_bucket",
    "leaky_bucket",
    "gcra",
)


@dataclass(frozen=True, slots=True)
class Limit:
    """One limit as an algorithm sees it: ``requests_per_unit`` per ``period_s`` seconds."""

    requests_per_unit: int
    period_s: int
    algorithm: str = "fixed_window"
    burst: int = 0  # token_bucket, leaky_bucket, gcra: capacity; the loader sets it (default L)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one hit on one limit came to."""

    allowed: bool
    remaining: int  # whole requests (of cost 1) still admissible now
    # When refused: seconds until a hit of the same cost would be admitted (never early).
    # When admitted: seconds until the state is fully reset.
    reset_s: float
    delay_s: float = 0.0  # leaky_bucket: how long the admitted hit must wait for its turn
    fits: bool = True  # False: the cost can never be admitted (cost > limit or burst)
