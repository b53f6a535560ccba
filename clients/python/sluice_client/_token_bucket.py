"""The token bucket a quota assignment hands out, enforced in process. Pure: the caller passes
the time (seconds on any monotonic clock), so tests drive it with plain numbers.

Tokens refill continuously at ``tokens_per_fill / fill_interval_s`` (as Envoy's own token
bucket does), so a fraction of an interval refills a fraction of the tokens; the bucket never
holds more than ``max_tokens`` and starts full.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TokenBucket", "TokenBucketSpec"]


@dataclass(frozen=True, slots=True)
class TokenBucketSpec:
    """What the server assigned: at most ``max_tokens`` at once, ``tokens_per_fill`` more every
    ``fill_interval_s``."""

    max_tokens: int
    tokens_per_fill: int
    fill_interval_s: float

    def __post_init__(self) -> None:
        if self.max_tokens < 0 or self.tokens_per_fill < 0:
            raise ValueError("token bucket: max_tokens and tokens_per_fill must be >= 0")
        if not self.fill_interval_s > 0:
            raise ValueError("token bucket: fill_interval must be > 0")

    @property
    def rate_per_s(self) -> float:
        return self.tokens_per_fill / self.fill_interval_s


class TokenBucket:
    """One bucket's tokens. Not thread-safe on its own: the quota's lock guards it."""

    __slots__ = ("_rate_per_s", "max_tokens", "spec", "tokens", "updated_s")

    def __init__(self, spec: TokenBucketSpec, *, now_s: float, tokens: float | None = None):
        self.spec = spec
        self.max_tokens = float(spec.max_tokens)
        self._rate_per_s = spec.rate_per_s
        self.tokens = self.max_tokens if tokens is None else min(tokens, self.max_tokens)
        self.updated_s = now_s

    def _refill(self, now_s: float) -> None:
        # A clock read on another thread may be a hair older than the last one: never refill
        # backwards, never move the reference time back.
        elapsed = now_s - self.updated_s
        if elapsed > 0:
            self.tokens = min(self.max_tokens, self.tokens + elapsed * self._rate_per_s)
            self.updated_s = now_s

    def take(self, cost: int, *, now_s: float) -> bool:
        """Take ``cost`` tokens if the bucket holds them (then True); else take none."""
        self._refill(now_s)
        if self.tokens >= cost:
            self.tokens -= cost
            return True
        return False

    def replaced(self, spec: TokenBucketSpec, *, now_s: float) -> TokenBucket:
        """The bucket under a new assignment for the same bucket. It keeps the tokens it holds
        (refilled at the old rate up to now), capped at the new ``max_tokens``: Sluice re-sends
        an assignment with every report, and starting each one full would hand out a fresh
        burst every report interval, over the rule's rate."""
        self._refill(now_s)
        return TokenBucket(spec, now_s=now_s, tokens=self.tokens)
