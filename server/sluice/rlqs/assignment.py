"""A stream's share of a limit as the token bucket Envoy enforces.

Envoy's token bucket counts whole tokens and fills in whole seconds (it refuses a
``fill_interval`` below one second and ignores nanos), so a share of R tokens per second
becomes ``tokens_per_fill`` tokens every ``fill_interval_s`` seconds: the shortest interval
whose whole number of tokens is within ``TOLERANCE`` of R, rounded down so the tokens given
out never exceed the share. ``max_tokens`` (also what a new bucket starts with) is the
stream's share of the burst, at least one token (so a stream with a tiny share can still
admit a first request) and at least one fill (a fill above the capacity would be lost).
"""

from __future__ import annotations

import math

from sluice.records import record

__all__ = ["TOLERANCE", "TokenBucket", "changed_enough", "token_bucket"]

# How far below the share the rounded rate may fall.
TOLERANCE = 0.02
_SHORT_INTERVALS = 1000  # searched one by one; beyond, the interval is computed


@record
class TokenBucket:
    max_tokens: int
    tokens_per_fill: int
    fill_interval_s: int

    @property
    def rate_per_s(self) -> float:
        return self.tokens_per_fill / self.fill_interval_s


def token_bucket(rate_per_s: float, burst: float) -> TokenBucket:
    """The bucket for a share of ``rate_per_s`` tokens per second and ``burst`` tokens."""
    if rate_per_s <= 0:
        raise ValueError(f"a token bucket needs a positive rate, not {rate_per_s}")
    interval = _interval(rate_per_s)
    tokens = max(1, math.floor(rate_per_s * interval * (1 + 1e-9)))
    return TokenBucket(max(1, tokens, math.floor(burst)), tokens, interval)


def _interval(rate_per_s: float) -> int:
    for interval in range(1, _SHORT_INTERVALS + 1):
        tokens = math.floor(rate_per_s * interval * (1 + 1e-9))
        if tokens >= 1 and tokens / interval >= rate_per_s * (1 - TOLERANCE):
            return interval
    # A rate below 1 token per 20 s: floor() loses less than TOLERANCE of it when a fill
    # holds 1 / TOLERANCE tokens' worth of time, and never rounds to zero when it holds one.
    return max(math.ceil(1 / rate_per_s), math.ceil(1 / (TOLERANCE * rate_per_s)))


def changed_enough(old: TokenBucket, new: TokenBucket) -> bool:
    """Worth sending: Envoy replaces a bucket whose numbers change by one that starts full,
    so every change admits up to ``max_tokens`` more. Decreases are sent unless within half
    the tolerance (the sum of shares stays within it); increases once they pass 5 %."""
    if new == old:
        return False
    old_rate, new_rate = old.rate_per_s, new.rate_per_s
    if new_rate < old_rate:
        return new_rate < old_rate * (1 - TOLERANCE / 2)
    return new_rate > old_rate * 1.05 or new.max_tokens > old.max_tokens * 1.05
