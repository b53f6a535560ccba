"""The decision: ShouldRateLimit as plain domain code, with envoyproxy/ratelimit's semantics.

One request becomes at most one backend call. Per descriptor: a client ``limit`` override
(for known domains) or the matching rule; ``unlimited`` rules answer OK without counting;
limits whose ``name`` another applicable rule ``replaces`` are dropped; shadow-mode rules
report OVER_LIMIT as OK; a global shadow mode makes the overall answer OK but leaves the
statuses untouched, so callers can still see what would have happened.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sluice.backends import Backend, Hit
from sluice.bounds import RequestBounds, check_request
from sluice.clock import Clock
from sluice.model import (
    Code,
    Decision,
    DescriptorStatus,
    Header,
    RateLimit,
    RateLimitRequest,
)
from sluice.policies.snapshot import Snapshot

__all__ = ["LimiterSettings", "RateLimiter", "UNLIMITED_REMAINING"]

# What envoyproxy/ratelimit reports as limit_remaining for an unlimited rule (MaxUint32).
UNLIMITED_REMAINING = 2**32 - 1


@dataclass(frozen=True, slots=True)
class LimiterSettings:
    bounds: RequestBounds = RequestBounds()
    global_shadow_mode: bool = False
    response_headers: bool = False  # IETF RateLimit/RateLimit-Policy fields and Retry-After


@dataclass(slots=True)
class _Applicable:
    index: int
    limit: RateLimit
    shadow_mode: bool
    counter_key: tuple[str, ...]
    cost: int


class RateLimiter:
    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        backend: Backend,
        clock: Clock,
        settings: LimiterSettings = LimiterSettings(),
    ) -> None:
        self._snapshot = snapshot
        self._backend = backend
        self._clock = clock
        self._settings = settings

    async def should_rate_limit(self, request: RateLimitRequest) -> Decision:
        check_request(request, self._settings.bounds)
        snapshot = self._snapshot()  # one snapshot for the whole request, even across a reload
        domain = request.domain
        default_cost = max(1, request.hits_addend)
        statuses: list[DescriptorStatus | None] = [None] * len(request.descriptors)
        applicable: list[_Applicable] = []
        replaced: set[str] = set()

        for i, descriptor in enumerate(request.descriptors):
            cost = default_cost if descriptor.hits_addend is None else descriptor.hits_addend
            if descriptor.limit is not None:
                if not snapshot.has_domain(domain):
                    continue  # envoyproxy/ratelimit ignores overrides for unknown domains
                override = descriptor.limit
                counter_key = (domain, *(part for entry in descriptor.entries for part in entry))
                limit = RateLimit(override.requests_per_unit, override.unit)
                applicable.append(_Applicable(i, limit, False, counter_key, cost))
                continue
            match = snapshot.lookup(domain, descriptor.entries)
            if match is None:
                continue
            rule = match.rule
            # Collected before unlimited rules are answered: an unlimited rule's replaces count.
            replaced.update(rule.replaces)
            if rule.unlimited:
                statuses[i] = DescriptorStatus(Code.OK, limit_remaining=UNLIMITED_REMAINING)
                continue
            assert rule.limit is not None
            applicable.append(_Applicable(i, rule.limit, rule.shadow_mode, match.counter_key, cost))

        if replaced:
            applicable = [a for a in applicable if not a.limit.name or a.limit.name not in replaced]

        if applicable:
            hits = [
                Hit(a.counter_key, a.limit.requests_per_unit, a.limit.unit.seconds, a.cost)
                for a in applicable
            ]
            outcomes = await self._backend.apply(hits, self._clock.now())
            for a, outcome in zip(applicable, outcomes, strict=True):
                code = Code.OK if outcome.allowed or a.shadow_mode else Code.OVER_LIMIT
                statuses[a.index] = DescriptorStatus(
                    code, a.limit, outcome.remaining, outcome.reset_s
                )

        final = tuple(s if s is not None else _NO_LIMIT for s in statuses)
        over = any(s.code is Code.OVER_LIMIT for s in final)
        overall = Code.OVER_LIMIT if over and not self._settings.global_shadow_mode else Code.OK
        headers = _rate_limit_headers(final, overall) if self._settings.response_headers else ()
        return Decision(overall, final, headers)


_NO_LIMIT = DescriptorStatus(Code.OK)


def _rate_limit_headers(
    statuses: tuple[DescriptorStatus, ...], overall: Code
) -> tuple[Header, ...]:
    """RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers) for the limit
    closest to exhaustion, plus Retry-After when the request is refused."""
    limited = [s for s in statuses if s.current_limit is not None]
    if not limited:
        return ()
    closest = min(limited, key=lambda s: s.limit_remaining)
    limit = closest.current_limit
    assert limit is not None
    name = _sf_string(limit.name or "default")
    headers = [
        Header("RateLimit-Policy", f"{name};q={limit.requests_per_unit};w={limit.unit.seconds}"),
        Header(
            "RateLimit", f"{name};r={closest.limit_remaining};t={closest.duration_until_reset_s}"
        ),
    ]
    if overall is Code.OVER_LIMIT:
        wait = max(s.duration_until_reset_s for s in statuses if s.code is Code.OVER_LIMIT)
        headers.append(Header("Retry-After", str(wait)))
    return tuple(headers)


def _sf_string(text: str) -> str:
    """An RFC 8941 sf-string; characters it cannot carry are replaced, never passed through."""
    safe = "".join(c if " " <= c <= "~" else "?" for c in text)
    return '"' + safe.replace("\\", "\\\\").replace('"', '\\"') + '"'
