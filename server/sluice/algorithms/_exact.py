"""Float helpers shared by the algorithms, mirrored operation for operation in the Lua prelude.

Times are doubles, so a reset computed as ``threshold - now`` can land one rounding step
early once a client adds it back to ``now``. Every reset is therefore checked against the
algorithm's own admission predicate and nudged up until it holds: never early, and exact
whenever the arithmetic is.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["EPS", "largest", "settle"]

EPS = 2.220446049250313e-16  # 2**-52, written out so Lua parses the identical double
_MAX_NUDGES = 200  # the nudge doubles each time, so a handful always suffices


def settle(t: float, r: float, admits: Callable[[float], bool]) -> float:
    """``r`` (clamped at 0), raised until ``admits(t + r)``; ``admits`` must be monotone."""
    if r < 0.0:
        r = 0.0
    d = max(abs(t + r), 1.0) * EPS
    for _ in range(_MAX_NUDGES):
        if admits(t + r):
            return r
        r = r + d
        d = d * 2.0
    return r


def largest(k: int, fits: Callable[[int], bool]) -> int:
    """The largest ``k' >= 0`` with ``fits(k')``, searched from the estimate ``k``.

    ``remaining`` is estimated with a division and then checked with the very comparison a
    hit of that cost would face, so it is never one too high (or low) after rounding.
    """
    if k < 0:
        k = 0
    while k > 0 and not fits(k):
        k -= 1
    while fits(k + 1):
        k += 1
    return k
