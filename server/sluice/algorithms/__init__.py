"""Rate-limit algorithms: one module each, a pure step function and its traits.

Each module ends with its ``ALGORITHM`` (``sluice.algorithms.base.Algorithm``):

    step(state, limit, now, cost) -> (new_state, outcome)
    expires_at(state, limit) -> float   # from then on the state is equivalent to None

``state`` is None for a key never seen (or expired). A rejected hit returns the old state
unchanged (the same object), except where ``counts_refused`` (fixed windows count every hit,
as envoyproxy/ratelimit does). They never touch storage or clocks, so the memory backend, the
Redis scripts' differential tests and the what-if tooling share one definition of each.

Adding an algorithm: its module here (with ``ALGORITHM``), one line below, its Lua file
(``backends/redis/lua/<name>.lua``), its tests and its docs.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from sluice.algorithms import (
    fixed_window,
    gcra,
    leaky_bucket,
    sliding_window_counter,
    sliding_window_log,
    token_bucket,
)
from sluice.algorithms.base import Algorithm, Limit, Outcome

__all__ = ["ALGORITHMS", "DEFAULT_ALGORITHM", "Algorithm", "Limit", "Outcome"]

# Name -> algorithm, in the order docs and error messages list them.
ALGORITHMS: Mapping[str, Algorithm] = MappingProxyType(
    {
        a.name: a
        for a in (
            fixed_window.ALGORITHM,
            sliding_window_log.ALGORITHM,
            sliding_window_counter.ALGORITHM,
            token_bucket.ALGORITHM,
            leaky_bucket.ALGORITHM,
            gcra.ALGORITHM,
        )
    }
)
# What a limit counts with when its policy names none, as in envoyproxy/ratelimit (and what
# client overrides count with).
DEFAULT_ALGORITHM = fixed_window.ALGORITHM
