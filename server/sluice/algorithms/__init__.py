"""Rate-limit algorithms as pure step functions.

Each is ``step(state, limit, now, cost) -> (state, outcome)``.

They never touch storage or clocks, so the memory backend, the Redis scripts' tests and the
what-if tooling all share one definition of each algorithm.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Outcome"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one hit on one limit came to."""

    allowed: bool
    remaining: int  # whole requests still admissible now
    reset_s: int  # when allowed: until the state is fully reset; when not: until a retry can pass
