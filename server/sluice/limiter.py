"""The decision: ShouldRateLimit as plain domain code, with envoyproxy/ratelimit's semantics.

One request becomes at most one backend call. Per descriptor: an operator's pin on that exact
descriptor while it lasts (a block: OVER_LIMIT at once, reason ``blocked``, nothing counted;
an allow: OK, nothing counted; an override: its own limit on its own counter), else a client
``limit`` override
(for known domains, unless the domain or ``--limit-overrides`` says to ignore or deny them) or
the matching rule; ``unlimited`` rules answer OK without counting;
limits whose ``name`` another applicable rule ``replaces`` are dropped; shadow-mode rules
report OVER_LIMIT as OK; a quota-mode rule's OVER_LIMIT (envoyproxy/ratelimit's
``quota_mode``) refuses the request only when every quota-mode descriptor of the request is
over (an unlimited one is no quota, a shadow-mode one is never over); otherwise the request is
OK while that descriptor's status still says OVER_LIMIT, as upstream answers; a global
shadow mode makes the overall answer OK but leaves the statuses untouched, so callers can
still see what would have happened.

A ``concurrency`` rule (leases held at once, sluice/leases) is answered from its lease
table without taking a lease: OK while fewer than its limit are held, OVER_LIMIT when all
are, with the leases still free as ``limit_remaining`` and, when full, the time until the
first held lease expires as ``duration_until_reset``.

A rule may hold several limits: its hit is admitted only if all admit it, and the status
reports the limit that decided (the refusing one with the longest wait, or else the one
closest to exhaustion).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sluice.algorithms import Limit, Outcome
from sluice.backends import Backend, Hit
from sluice.backends.memory import synchronous_apply
from sluice.bounds import RequestBounds, check_request
from sluice.clock import Clock
from sluice.errors import BackendUnavailableError, InvalidRequestError
from sluice.leases.memory import MemoryLeaseStore
from sluice.leases.store import LeaseStore
from sluice.model import (
    LIMIT_OVERRIDES,
    Code,
    Decision,
    DescriptorStatus,
    Header,
    RateLimit,
    RateLimitRequest,
    Unit,
)
from sluice.policies.snapshot import ALLOW, BLOCK, Match, PinMatch, Snapshot
from sluice.usage.recorder import (
    ALLOWED,
    BACKEND_ERROR,
    BLOCKED,
    OVER_LIMIT,
    SHADOW_OVER,
    UsageRecorder,
)

__all__ = [
    "BLOCKED_REASON",
    "FAILURE_MODES",
    "LimiterSettings",
    "RateLimiter",
    "UNLIMITED_REMAINING",
]

# What envoyproxy/ratelimit reports as limit_remaining for an unlimited rule (MaxUint32).
UNLIMITED_REMAINING = 2**32 - 1
# What to answer when the backend cannot: admit, refuse, or raise (gRPC UNAVAILABLE, so that
# Envoy's own failure_mode_deny decides).
FAILURE_MODES = ("allow", "deny", "error")
# The reason a blocked descriptor's status carries (the response's sluice_reasons metadata).
BLOCKED_REASON = "blocked"


@dataclass(frozen=True, slots=True)
class LimiterSettings:
    bounds: RequestBounds = RequestBounds()
    global_shadow_mode: bool = False
    response_headers: bool = False  # IETF RateLimit/RateLimit-Policy fields and Retry-After
    failure_mode: str = "error"
    limit_overrides: str = "allow"  # what a domain that does not say does with client limits


@dataclass(slots=True)
class _Applicable:
    match: Match
    index: int  # of the descriptor in the request
    cost: int


class RateLimiter:
    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        backend: Backend,
        clock: Clock,
        settings: LimiterSettings = LimiterSettings(),
        recorder: UsageRecorder | None = None,
        leases: LeaseStore | None = None,
    ) -> None:
        """``leases``: the lease tables ``concurrency`` rules are answered from (the lease
        service's own store; a private memory one if not given)."""
        if settings.failure_mode not in FAILURE_MODES:
            raise ValueError(f"failure_mode must be one of {FAILURE_MODES}")
        if settings.limit_overrides not in LIMIT_OVERRIDES:
            raise ValueError(f"limit_overrides must be one of {LIMIT_OVERRIDES}")
        self._snapshot = snapshot
        self._backend = backend
        self._apply_now = synchronous_apply(backend)
        self._clock = clock
        self._settings = settings
        self._recorder = recorder
        self._leases: LeaseStore = leases if leases is not None else MemoryLeaseStore()
        self.backend_errors = 0  # requests whose backend call failed (upstream's redis_error)
        self.global_shadow_answers = 0  # OVER_LIMIT answered OK by global shadow mode

    async def should_rate_limit(self, request: RateLimitRequest) -> Decision:
        check_request(request, self._settings.bounds)
        snapshot = self._snapshot()  # one snapshot for the whole request, even across a reload
        domain = request.domain
        default_cost = max(1, request.hits_addend)  # 0 means 1, as in Envoy's API
        statuses = [_NO_LIMIT] * len(request.descriptors)
        applicable: list[_Applicable] = []
        leased: list[_Applicable] = []  # descriptors of concurrency rules
        replaced: set[str] = set()
        recorder = self._recorder
        quota_descriptors = 0
        overrides = snapshot.limit_overrides(domain) or self._settings.limit_overrides
        if overrides == "deny":
            _refuse_overrides(request)
        honour_overrides = overrides == "allow"
        pins = snapshot.pins(domain)
        now = -1.0  # read from the clock only when a pin is found: most requests have none
        over = False

        for i, descriptor in enumerate(request.descriptors):
            cost = default_cost if descriptor.hits_addend is None else descriptor.hits_addend
            pin: PinMatch | None = pins.get(descriptor.entries) if pins else None
            if pin is not None:
                if now < 0:
                    now = self._clock.now()
                if now >= pin.expires_at_s:
                    pin = None  # expired: the rule applies again, nothing to clean up
            if pin is not None:
                if pin.kind == BLOCK:
                    statuses[i] = _blocked(pin, now)
                    over = True
                    if recorder is not None:
                        recorder.record(pin.match.rule_id, BLOCKED, cost=cost)
                    continue
                if pin.kind == ALLOW:
                    statuses[i] = _UNLIMITED
                    if recorder is not None:
                        recorder.record(pin.match.rule_id, ALLOWED, cost=cost)
                    continue
                match: Match | None = pin.match
            elif descriptor.limit is not None and honour_overrides:
                match = snapshot.override(domain, descriptor.entries, descriptor.limit)
            else:
                match = snapshot.lookup(domain, descriptor.entries)
            if match is None:
                continue
            # Collected before unlimited rules are answered: an unlimited rule's replaces count.
            if match.replaces:
                replaced.update(match.replaces)
            if match.unlimited:
                # Not a quota upstream counts, even with quota_mode: it checks no limit.
                statuses[i] = _UNLIMITED
                if recorder is not None:
                    recorder.record(match.rule_id, ALLOWED, cost=cost, key=match.counter_key)
                    # Upstream's statsd counts nothing for an unlimited rule.
                    recorder.record_named(match.rule_id, "", ALLOWED, cost=cost)
                continue
            if match.concurrency is not None:
                leased.append(_Applicable(match, i, cost))
                continue
            applicable.append(_Applicable(match, i, cost))

        if replaced:
            applicable = [a for a in applicable if a.match.name not in replaced]
            leased = [a for a in leased if a.match.name not in replaced]

        quota_over: list[int] = []
        if leased:
            for a, status in zip(leased, await self._count_leases(leased), strict=True):
                statuses[a.index] = status
                if a.match.quota_mode:
                    quota_descriptors += 1
                    if status.code is Code.OVER_LIMIT:
                        quota_over.append(a.index)
                elif status.code is Code.OVER_LIMIT:
                    over = True
        if applicable:
            hits = [Hit(a.match.counter_key, a.match.limits, a.cost) for a in applicable]
            try:
                if self._apply_now is not None:
                    outcomes = self._apply_now(hits, self._clock.now())
                else:
                    outcomes = await self._backend.apply(hits, self._clock.now())
            except BackendUnavailableError:
                self.backend_errors += 1
                if recorder is not None:
                    for a in applicable:
                        recorder.record(a.match.rule_id, BACKEND_ERROR, cost=a.cost)
                        name = a.match.metric_name
                        if name is not None:
                            recorder.record_named(a.match.rule_id, name, BACKEND_ERROR, cost=a.cost)
                if self._settings.failure_mode == "error":
                    raise
                outcomes = None
            for n, a in enumerate(applicable):
                if outcomes is None:
                    status = self._failed(a)
                else:
                    status, admitted = _status(a, outcomes[n])
                    if recorder is not None:
                        self._record(a, status, admitted, outcomes[n])
                statuses[a.index] = status
                quota = a.match.quota_mode
                if quota:
                    quota_descriptors += 1
                if status.code is Code.OVER_LIMIT:
                    if quota:
                        quota_over.append(a.index)
                    else:
                        over = True
        if quota_over and len(quota_over) == quota_descriptors:
            over = True  # every quota is spent: refused, as upstream refuses it

        final = tuple(statuses)
        overall = Code.OVER_LIMIT if over else Code.OK
        if over and self._settings.global_shadow_mode:
            overall = Code.OK
            self.global_shadow_answers += 1
        headers = _rate_limit_headers(final, overall) if self._settings.response_headers else ()
        return Decision(overall, final, headers)

    def _record(
        self,
        a: _Applicable,
        status: DescriptorStatus,
        admitted: bool,
        outcomes: Sequence[Outcome],
    ) -> None:
        recorder = self._recorder
        assert recorder is not None
        if admitted:
            limit = status.current_limit
            near = (
                recorder.near_hits(limit.requests_per_unit, status.limit_remaining, a.cost)
                if limit is not None
                else 0
            )
            recorder.record(
                a.match.rule_id, ALLOWED, cost=a.cost, near=near, key=a.match.counter_key
            )
            if a.match.metric_name is not None:
                recorder.record_named(
                    a.match.rule_id, a.match.metric_name, ALLOWED, cost=a.cost, near=near
                )
            return
        # The concrete values: who is being limited (only built for refused hits).
        offender = ",".join(a.match.counter_key[1:])
        kind = SHADOW_OVER if a.match.shadow_mode else OVER_LIMIT
        # The local over-limit cache answers a hit whole: all its outcomes are its own.
        local = outcomes[0].local
        recorder.record(
            a.match.rule_id,
            kind,
            cost=a.cost,
            offender=offender,
            local=local,
            key=a.match.counter_key,
        )
        if a.match.metric_name is not None:
            recorder.record_named(
                a.match.rule_id, a.match.metric_name, kind, cost=a.cost, local=local
            )

    async def _count_leases(self, leased: list[_Applicable]) -> list[DescriptorStatus]:
        """The status of each concurrency rule's descriptor: its leases held now."""
        recorder = self._recorder
        try:
            counts = await self._leases.in_flight(
                [a.match.counter_key for a in leased], now=self._clock.now()
            )
        except BackendUnavailableError:
            self.backend_errors += 1
            if recorder is not None:
                for a in leased:
                    _record_lease(recorder, a, BACKEND_ERROR)
            if self._settings.failure_mode == "error":
                raise
            return [self._failed(a) for a in leased]
        statuses: list[DescriptorStatus] = []
        for a, held in zip(leased, counts, strict=True):
            reported = _concurrency_limit(a.match)
            limit = reported.requests_per_unit
            if held.count < limit:
                statuses.append(DescriptorStatus(Code.OK, reported, limit - held.count))
                if recorder is not None:
                    _record_lease(recorder, a, ALLOWED)
                continue
            code = Code.OK if a.match.shadow_mode else Code.OVER_LIMIT
            reason = "" if limit > 0 else "the concurrency limit is 0: no lease is ever granted"
            statuses.append(DescriptorStatus(code, reported, 0, held.next_expiry_s, reason=reason))
            if recorder is not None:
                kind = SHADOW_OVER if a.match.shadow_mode else OVER_LIMIT
                _record_lease(recorder, a, kind, offender=",".join(a.match.counter_key[1:]))
        return statuses

    def _failed(self, a: _Applicable) -> DescriptorStatus:
        if self._settings.failure_mode == "allow":
            return _NO_LIMIT
        code = Code.OK if a.match.shadow_mode else Code.OVER_LIMIT
        reported = a.match.limits[0].rate_limit if a.match.limits else _concurrency_limit(a.match)
        return DescriptorStatus(code, reported, 0, 0, reason="rate-limit state unavailable")


_NO_LIMIT = DescriptorStatus(Code.OK)


def _record_lease(
    recorder: UsageRecorder, a: _Applicable, kind: int, offender: str | None = None
) -> None:
    """Usage of a concurrency rule's descriptor, under its rule and its statsd name."""
    recorder.record(a.match.rule_id, kind, cost=a.cost, offender=offender)
    if a.match.metric_name is not None:
        recorder.record_named(a.match.rule_id, a.match.metric_name, kind, cost=a.cost)


def _concurrency_limit(match: Match) -> RateLimit:
    """A concurrency rule's limit as ShouldRateLimit reports it: leases, per no unit of time
    (``UNKNOWN``, 0 on the wire)."""
    concurrency = match.concurrency
    assert concurrency is not None
    return RateLimit(concurrency.max_leases, Unit.UNKNOWN, match.name)


_UNLIMITED = DescriptorStatus(Code.OK, limit_remaining=UNLIMITED_REMAINING)


def _blocked(pin: PinMatch, now: float) -> DescriptorStatus:
    # Until the block expires, if it does: Retry-After then says when to come back.
    until = pin.expires_at_s - now if pin.expires_at_s != float("inf") else 0.0
    return DescriptorStatus(Code.OVER_LIMIT, None, 0, until, reason=BLOCKED_REASON)


def _refuse_overrides(request: RateLimitRequest) -> None:
    for i, descriptor in enumerate(request.descriptors):
        if descriptor.limit is not None:
            raise InvalidRequestError(
                f"descriptors[{i}].limit: domain '{request.domain}' does not accept limit "
                f"overrides from clients"
            )


def _status(a: _Applicable, outcomes: Sequence[Outcome]) -> tuple[DescriptorStatus, bool]:
    """One status for a rule's limits (the refusing limit with the longest wait, or else the
    limit closest to exhaustion), and whether the hit was admitted."""
    if len(outcomes) == 1:
        chosen = 0
    else:
        refused = [i for i, o in enumerate(outcomes) if not o.allowed]
        if refused:
            chosen = max(refused, key=lambda i: outcomes[i].reset_s)
        else:
            chosen = min(range(len(outcomes)), key=lambda i: outcomes[i].remaining)
    outcome = outcomes[chosen]
    limit = a.match.limits[chosen]
    reported = limit.rate_limit
    if outcome.allowed:
        delay = outcome.delay_s if len(outcomes) == 1 else max(o.delay_s for o in outcomes)
        reset = _reset(limit, outcome)
        return DescriptorStatus(Code.OK, reported, outcome.remaining, reset, delay), True
    code = Code.OK if a.match.shadow_mode else Code.OVER_LIMIT
    reason = "" if outcome.fits else _never_fits(a.cost, limit)
    reset = _reset(limit, outcome)
    return DescriptorStatus(code, reported, outcome.remaining, reset, reason=reason), False


def _reset(limit: Limit, outcome: Outcome) -> float:
    # Fixed windows report whole seconds, rounded up: envoyproxy/ratelimit's numbers exactly.
    if limit.algorithm.whole_second_resets:
        return _whole_seconds(outcome.reset_s)
    return outcome.reset_s


def _never_fits(cost: int, limit: Limit) -> str:
    if limit.requests_per_unit == 0:
        return "the limit is 0: nothing is ever admitted"
    return (
        f"a cost of {cost} can never be admitted: the {limit.algorithm.name} capacity is "
        f"{limit.burst}"
    )


def _rate_limit_headers(
    statuses: tuple[DescriptorStatus, ...], overall: Code
) -> tuple[Header, ...]:
    """RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers) for the limit
    closest to exhaustion, plus Retry-After when the request is refused."""
    # A concurrency limit has no window to describe: the fields say nothing of it.
    limited = [
        s
        for s in statuses
        if s.current_limit is not None and s.current_limit.unit is not Unit.UNKNOWN
    ]
    if not limited:
        return ()
    closest = min(limited, key=lambda s: s.limit_remaining)
    limit = closest.current_limit
    assert limit is not None
    name = _sf_string(limit.name or "default")
    reset = _whole_seconds(closest.duration_until_reset_s)
    headers = [
        Header("RateLimit-Policy", f"{name};q={limit.requests_per_unit};w={limit.unit.seconds}"),
        Header("RateLimit", f"{name};r={closest.limit_remaining};t={reset}"),
    ]
    if overall is Code.OVER_LIMIT:
        wait = max(s.duration_until_reset_s for s in statuses if s.code is Code.OVER_LIMIT)
        headers.append(Header("Retry-After", str(_whole_seconds(wait))))
    return tuple(headers)


def _whole_seconds(seconds: float) -> int:
    """Rounded up: a client told to retry after this many seconds is never early."""
    whole = int(seconds)
    return whole if whole == seconds else whole + 1


def _sf_string(text: str) -> str:
    """An RFC 8941 sf-string; characters it cannot carry are replaced, never passed through."""
    safe = "".join(c if " " <= c <= "~" else "?" for c in text)
    return '"' + safe.replace("\\", "\\\\").replace('"', '\\"') + '"'
