"""Leases as the gRPC service offers them: acquire, renew and release for a descriptor,
checked against the live snapshot's ``concurrency`` rule, held in a ``LeaseStore``.

Plain domain code: the servicer (``sluice/grpc/leases.py``) converts protobuf to these calls
and back. A lease is named by its descriptor (domain and entries) and a random id the
acquire hands out; renew and release name both, so a store finds the table in one step.
The lease's TTL is the rule's ``lease_ttl`` or, if the client asks, a shorter one: the rule
bounds how long a client that dies can hold a slot.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from sluice.bounds import RequestBounds
from sluice.clock import Clock
from sluice.errors import DomainNotFoundError, InvalidRequestError, NoConcurrencyRuleError
from sluice.leases.store import CounterKey, LeaseStore
from sluice.leases.table import Acquired
from sluice.model import Concurrency
from sluice.policies.descriptor_text import format_duration, format_entries
from sluice.policies.snapshot import BLOCK, Snapshot

__all__ = ["BLOCKED_REASON", "Grant", "LeaseService", "Renewal", "new_lease_id"]

# As ShouldRateLimit's reason for a blocked descriptor (sluice.limiter.BLOCKED_REASON).
BLOCKED_REASON = "blocked"
_UNLIMITED_LEASES = 2**32 - 1  # what a shadow-mode rule's table is filled up to

Entries = tuple[tuple[str, str], ...]


def new_lease_id() -> str:
    """128 random bits: a lease id nobody can guess, so only its holder can release it."""
    return secrets.token_urlsafe(16)


@dataclass(frozen=True, slots=True)
class Grant:
    """An acquire's answer. ``lease_id`` is empty when not granted; ``ttl_s`` is how long
    the lease lasts unrenewed; ``retry_after_s``: when refused, until the first held lease
    expires (0 with none held: a limit of 0 never grants). ``reason``: ``blocked`` when an
    operator's block on the descriptor refused it (then ``retry_after_s`` is until the block
    ends, 0 if it does not, and ``in_flight`` is not read)."""

    granted: bool
    lease_id: str
    ttl_s: float
    max_leases: int
    in_flight: int
    retry_after_s: float = 0.0
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Renewal:
    """A renew's answer: ``renewed`` (False: the lease was not held, it expired or was
    released, and its slot may be taken) and the TTL it now has."""

    renewed: bool
    ttl_s: float


@dataclass(frozen=True, slots=True)
class _Target:
    key: CounterKey
    concurrency: Concurrency
    blocked_until_s: float | None = None  # an operator's block in force (inf: no end)
    shadow_mode: bool = False


class LeaseService:
    def __init__(
        self,
        snapshot: Callable[[], Snapshot],
        store: LeaseStore,
        clock: Clock,
        *,
        bounds: RequestBounds = RequestBounds(),
        new_id: Callable[[], str] = new_lease_id,
    ) -> None:
        self._snapshot = snapshot
        self.store = store
        self._clock = clock
        self._bounds = bounds
        self._new_id = new_id

    async def acquire(self, domain: str, entries: Entries, *, ttl_s: float = 0) -> Grant:
        """``ttl_s``: 0 for the rule's ``lease_ttl``, else at most that."""
        target = self._target(domain, entries)
        ttl = _ttl(ttl_s, target.concurrency)
        limit = target.concurrency.max_leases
        now = self._clock.now()
        if target.blocked_until_s is not None:
            until = target.blocked_until_s - now if target.blocked_until_s != math.inf else 0.0
            return Grant(False, "", ttl, limit, 0, until, BLOCKED_REASON)
        lease_id = self._new_id()
        # Shadow mode enforces nothing: every lease is granted, and ``in_flight`` above
        # ``max_leases`` shows what the limit would have refused.
        enforced = _UNLIMITED_LEASES if target.shadow_mode else limit
        result: Acquired = await self.store.acquire(
            target.key, lease_id, max_leases=enforced, ttl_s=ttl, now=now
        )
        return Grant(
            result.granted,
            lease_id if result.granted else "",
            ttl,
            limit,
            result.in_flight,
            result.retry_after_s,
        )

    async def renew(
        self, domain: str, entries: Entries, lease_id: str, *, ttl_s: float = 0
    ) -> Renewal:
        target = self._target(domain, entries)
        _check_lease_id(lease_id)
        ttl = _ttl(ttl_s, target.concurrency)
        renewed = await self.store.renew(target.key, lease_id, ttl_s=ttl, now=self._clock.now())
        return Renewal(renewed, ttl)

    async def release(self, domain: str, entries: Entries, lease_id: str) -> bool:
        """True if the lease was held and is now given back; False if it was not held
        (unknown, released already, or expired): nothing to do, and nothing changes."""
        target = self._target(domain, entries)
        _check_lease_id(lease_id)
        return await self.store.release(target.key, lease_id, now=self._clock.now())

    def _target(self, domain: str, entries: Entries) -> _Target:
        _check_descriptor(domain, entries, self._bounds)
        snapshot = self._snapshot()
        if not snapshot.has_domain(domain):
            raise DomainNotFoundError(f"domain: no policy for domain '{domain}'")
        match = snapshot.lookup(domain, entries)
        if match is None or match.concurrency is None:
            raise NoConcurrencyRuleError(
                f"entries: no concurrency rule of domain '{domain}' matches "
                f"{format_entries(entries)}"
            )
        # A block refuses new leases at once, as it refuses ShouldRateLimit; renewals and
        # releases of leases already held go on (they give slots back or keep work going).
        # Allows and overrides bring no concurrency limit of their own: they do not apply.
        pin = snapshot.pins(domain).get(entries)
        if pin is not None and pin.kind == BLOCK and self._clock.now() < pin.expires_at_s:
            return _Target(match.counter_key, match.concurrency, pin.expires_at_s)
        return _Target(match.counter_key, match.concurrency, shadow_mode=match.shadow_mode)


def _ttl(ttl_s: float, concurrency: Concurrency) -> float:
    if ttl_s == 0:
        return concurrency.lease_ttl_s
    if not 0 < ttl_s <= concurrency.lease_ttl_s:
        raise InvalidRequestError(
            f"ttl: must be more than 0 and at most the rule's lease_ttl of "
            f"{format_duration(concurrency.lease_ttl_s)}, not {format_duration(ttl_s)}"
        )
    return ttl_s


def _check_lease_id(lease_id: str) -> None:
    if not lease_id:
        raise InvalidRequestError("lease_id: must not be empty")
    if len(lease_id) > 64:
        raise InvalidRequestError(f"lease_id: {len(lease_id)} characters, more than 64")


def _check_descriptor(domain: str, entries: Entries, bounds: RequestBounds) -> None:
    if not domain:
        raise InvalidRequestError("domain: must not be empty")
    if len(domain) > bounds.max_domain_length:
        raise InvalidRequestError(
            f"domain: {len(domain)} characters, more than the maximum of {bounds.max_domain_length}"
        )
    if not entries:
        raise InvalidRequestError("entries: must not be empty")
    if len(entries) > bounds.max_entries:
        raise InvalidRequestError(
            f"entries: {len(entries)} entries, more than the maximum of {bounds.max_entries}"
        )
    for j, (key, value) in enumerate(entries):
        if not key:
            raise InvalidRequestError(f"entries[{j}].key: must not be empty")
        if len(key) > bounds.max_key_length:
            raise InvalidRequestError(
                f"entries[{j}].key: {len(key)} characters, more than the maximum of "
                f"{bounds.max_key_length}"
            )
        if len(value) > bounds.max_value_length:
            raise InvalidRequestError(
                f"entries[{j}].value: {len(value)} characters, more than the maximum of "
                f"{bounds.max_value_length}"
            )
