"""A stream's share of a limit as the token bucket Envoy enforces.

Envoy refills its token bucket continuously at ``tokens_per_fill / fill_interval`` tokens a
second, but reads the interval in whole seconds (its nanos are dropped) and the tokens as a
whole number, so a share of R tokens a second becomes ``tokens_per_fill`` tokens every
``fill_interval_s`` seconds: the shortest interval whose whole number of tokens is within
``TOLERANCE`` of R, rounded down so the tokens given out never exceed the share.
``max_tokens`` (also what a new bucket starts with) is the stream's share of the burst, at
least one token, so a stream with a tiny share can still admit a first request.

Envoy 1.39 compares a new token bucket with the one it holds by ``max_tokens``,
``tokens_per_fill`` and the interval's *nanos* only: a change of the interval's seconds
alone would be ignored and the old rate kept. ``replacing`` makes such a change visible.
"""

from __future__ import annotations

import math

from sluice.records import record

__all__ = ["TOLERANCE", "TokenBucket", "changed_enough", "replacing", "token_bucket"]

# How far below the share the rounded rate may fall.
TOLERANCE = 0.02
_MAX_STEPS = 100


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
    tokens = max(1, _tokens(rate_per_s, interval))
    return TokenBucket(max(1, math.floor(burst)), tokens, interval)


def replacing(old: TokenBucket, new: TokenBucket) -> TokenBucket:
    """``new`` as sent in place of ``old``: one token more of capacity when only the
    interval differs, so that Envoy sees the change (see above)."""
    if (
        new.fill_interval_s != old.fill_interval_s
        and new.max_tokens == old.max_tokens
        and new.tokens_per_fill == old.tokens_per_fill
    ):
        return TokenBucket(new.max_tokens + 1, new.tokens_per_fill, new.fill_interval_s)
    return new


def _interval(rate_per_s: float) -> int:
    """The shortest whole number of seconds whose whole tokens come within TOLERANCE of the
    rate (at most ~50 steps whatever the rate: a fill of k tokens is best at its shortest
    interval, ceil(k / rate), and k ≈ 49 × rate always fits)."""
    if rate_per_s >= 1:
        for interval in range(1, _MAX_STEPS + 1):
            if _tokens(rate_per_s, interval) >= rate_per_s * (1 - TOLERANCE) * interval:
                return interval
        return _MAX_STEPS  # not reached: 50 s of tokens always fits
    for tokens in range(1, _MAX_STEPS + 1):
        interval = math.ceil(tokens / rate_per_s * (1 - 1e-12))
        if _tokens(rate_per_s, interval) >= rate_per_s * (1 - TOLERANCE) * interval:
            return interval
    return math.ceil(1 / rate_per_s)  # not reached


def _tokens(rate_per_s: float, interval: int) -> int:
    # A hair above the product, so 0.1 x 10 is 1 token, not 0.
    return math.floor(rate_per_s * interval * (1 + 1e-9))


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
