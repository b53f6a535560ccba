"""The one place lease requests are built and responses read, shared by ``Lease`` and
``AsyncLease``. Pure: no I/O."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import grpc

from sluice_client._proto.sluice.lease.v1 import lease_pb2
from sluice_client.errors import InvalidRequest, SluiceUnavailable
from sluice_client.types import OnUnavailable

__all__ = [
    "LeaseTarget",
    "build_target",
    "entries_of",
    "failed",
    "renew_interval_s",
]

Entries = Mapping[str, str] | Sequence[tuple[str, str]]
_UINT32_MAX = 2**32 - 1


@dataclass(frozen=True, slots=True)
class LeaseTarget:
    """What every call for one lease names: the descriptor, and the TTL asked for (ms; 0 for
    the rule's ``lease_ttl``)."""

    domain: str
    entries: tuple[lease_pb2.Entry, ...]
    ttl_ms: int

    def acquire(self) -> lease_pb2.AcquireRequest:
        return lease_pb2.AcquireRequest(
            domain=self.domain, entries=self.entries, ttl_ms=self.ttl_ms
        )

    def renew(self, lease_id: str) -> lease_pb2.RenewRequest:
        return lease_pb2.RenewRequest(
            domain=self.domain, entries=self.entries, lease_id=lease_id, ttl_ms=self.ttl_ms
        )

    def release(self, lease_id: str) -> lease_pb2.ReleaseRequest:
        return lease_pb2.ReleaseRequest(domain=self.domain, entries=self.entries, lease_id=lease_id)


def entries_of(entries: Entries) -> tuple[lease_pb2.Entry, ...]:
    if isinstance(entries, str) or not isinstance(entries, Mapping | Sequence):
        raise InvalidRequest("entries: must be a mapping or a list of (key, value) pairs")
    pairs = list(entries.items()) if isinstance(entries, Mapping) else list(entries)
    if not pairs:
        raise InvalidRequest("entries: must not be empty")
    out = []
    for j, pair in enumerate(pairs):
        if not isinstance(pair, tuple | list) or len(pair) != 2:
            raise InvalidRequest(f"entries[{j}]: must be a (key, value) pair")
        key, value = pair
        if not isinstance(key, str) or not key:
            raise InvalidRequest(f"entries[{j}].key: must be a non-empty string")
        if not isinstance(value, str):
            raise InvalidRequest(f"entries[{j}].value: must be a string")
        out.append(lease_pb2.Entry(key=key, value=value))
    return tuple(out)


def build_target(domain: str, entries: Entries, ttl_s: float | None) -> LeaseTarget:
    if not isinstance(domain, str) or not domain:
        raise InvalidRequest("domain: must be a non-empty string")
    ttl_ms = 0
    if ttl_s is not None:
        if isinstance(ttl_s, bool) or not isinstance(ttl_s, int | float) or not ttl_s > 0:
            raise InvalidRequest(
                f"ttl_s: must be a number > 0 (or None for the rule's), not {ttl_s!r}"
            )
        ttl_ms = math.ceil(ttl_s * 1000)
        if ttl_ms > _UINT32_MAX:
            raise InvalidRequest(f"ttl_s: {ttl_s} is out of range")
    return LeaseTarget(domain, entries_of(entries), ttl_ms)


def renew_interval_s(ttl_ms: int) -> float:
    """How often a held lease is renewed: three times per TTL, so two renewals in a row can
    fail (a restarting Sluice, a lost packet) before it lapses."""
    return ttl_ms / 3000


def failed(error: grpc.RpcError, *, on_unavailable: OnUnavailable) -> bool:
    """What a failed Acquire means: granted (True) or not, by ``on_unavailable``; raises for
    a refused request (InvalidRequest) or with ``"raise"`` (SluiceUnavailable)."""
    code = error.code() if hasattr(error, "code") else None
    details = (error.details() if hasattr(error, "details") else None) or str(error)
    if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND):
        # NOT_FOUND: no policy for the domain, or no concurrency rule for the descriptor.
        raise InvalidRequest(f"Sluice refused the lease: {details}")
    name = code.name if code is not None else "error"
    if on_unavailable == "raise":
        raise SluiceUnavailable(f"Sluice gave no lease ({name}): {details}", code=code)
    return on_unavailable == "allow"
