"""The client's plain types: what a caller sends (descriptors) and gets back (decisions).

No protobuf here; ``_wire`` converts at the boundary.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

__all__ = [
    "UNIT_SECONDS",
    "Decision",
    "Descriptor",
    "DescriptorDecision",
    "DescriptorLike",
    "Limit",
    "OnUnavailable",
    "QuotaDecision",
]

# Fixed lengths, as Sluice and envoyproxy/ratelimit count them (a month is 30 days).
UNIT_SECONDS: Mapping[str, int] = {
    "second": 1,
    "minute": 60,
    "hour": 60 * 60,
    "day": 24 * 60 * 60,
    "week": 7 * 24 * 60 * 60,
    "month": 30 * 24 * 60 * 60,
    "year": 365 * 24 * 60 * 60,
}

OnUnavailable: TypeAlias = Literal["allow", "deny", "raise"]


@dataclass(frozen=True, slots=True)
class Limit:
    """A limit: ``requests_per_unit`` per ``unit`` (``"second"`` … ``"year"``).

    In a decision, ``name`` is the rule's name as Sluice reports it. As a descriptor's
    override only ``requests_per_unit`` and ``unit`` are sent (Envoy's API has no name there).
    """

    requests_per_unit: int
    unit: str
    name: str = ""

    @property
    def window_s(self) -> int:
        """Length of one window in seconds (0 for a unit this client does not know)."""
        return UNIT_SECONDS.get(self.unit, 0)


@dataclass(frozen=True, slots=True)
class Descriptor:
    """A descriptor with more than entries: its own ``hits`` (0 checks without consuming) or a
    ``limit`` that overrides the configured one. ``entries`` is a mapping (its items, in
    order) or a sequence of (key, value) pairs."""

    entries: Mapping[str, str] | Sequence[tuple[str, str]]
    hits: int | None = field(default=None, kw_only=True)
    limit: Limit | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        pairs = self.entries.items() if isinstance(self.entries, Mapping) else self.entries
        # Stored as a tuple so a Descriptor is hashable and cannot change after the check.
        object.__setattr__(self, "entries", tuple((k, v) for k, v in pairs))


# What check() takes for each descriptor: {"user": "alice"} or Descriptor(...).
DescriptorLike: TypeAlias = Mapping[str, str] | Descriptor


@dataclass(frozen=True, slots=True)
class DescriptorDecision:
    """Sluice's answer for one descriptor.

    ``limit`` is None when no rule applies (or the rule is unlimited). ``reset_s`` is how long
    until the limit is fully available again (the fixed window's end, a bucket's refill).
    ``delay_s`` (leaky bucket) is how long an admitted request should wait its turn.
    ``reason`` is set when the request can never be admitted as sent, or Sluice was not asked.
    """

    allowed: bool
    limit: Limit | None = None
    remaining: int = 0
    reset_s: float = 0.0
    delay_s: float = 0.0
    reason: str = ""

    @property
    def retry_after_s(self) -> float | None:
        """When refused: how long until trying again can succeed; None when allowed or never."""
        if self.allowed or self.reason:
            return None
        return self.reset_s


@dataclass(frozen=True, slots=True)
class Decision:
    """The whole answer: ``allowed`` unless some descriptor is over its limit.

    ``statuses`` has one entry per descriptor, in request order. ``headers`` are the response
    headers Sluice suggests (RateLimit-Policy, RateLimit, Retry-After when it runs with
    ``--response-headers``). ``degraded`` marks a decision made by the client's
    ``on_unavailable`` choice because Sluice could not be asked.
    """

    allowed: bool
    statuses: tuple[DescriptorDecision, ...]
    headers: tuple[tuple[str, str], ...] = ()
    degraded: bool = False

    @property
    def retry_after_s(self) -> float | None:
        """When refused: the longest wait any refused descriptor asks for; None when allowed,
        or when some refused descriptor can never be admitted (or none says when)."""
        if self.allowed:
            return None
        refused = [s for s in self.statuses if not s.allowed]
        waits = [s.retry_after_s for s in refused]
        if not waits or any(w is None for w in waits):
            return None
        return max(w for w in waits if w is not None)

    @property
    def delay_s(self) -> float:
        """When allowed: how long to wait before going ahead (leaky bucket), else 0."""
        if not self.allowed:
            return 0.0
        return max((s.delay_s for s in self.statuses), default=0.0)


@dataclass(frozen=True, slots=True)
class QuotaDecision:
    """A quota's answer for one request, decided in process (``Quota.allow``). True in a
    boolean context when allowed. ``degraded`` marks a decision made by the client's
    ``on_unavailable`` choice because no live assignment was held for the bucket (none yet,
    expired, or the stream to Sluice is down past the assignment's time to live)."""

    allowed: bool
    degraded: bool = False

    def __bool__(self) -> bool:
        return self.allowed
