"""Which rule governs an RLQS bucket, and what it gives out.

A bucket (``BucketId``: an unordered map of key → value) is matched like a request descriptor
whose entries are the bucket's, in the order of the domain's one rule chain with exactly
those keys: values then match as in ShouldRateLimit (exact beats wildcard beats key-only),
an operator's pins apply to the same entries, and the counter key the chain's rule gives is
the bucket's identity for sharing (every stream reporting a bucket with that counter key
shares one limit). Two chains with the same keys in different orders would make a bucket
ambiguous; ``ambiguous_chains`` finds them, and the policy loader refuses such a policy.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping

from sluice.model import DomainPolicy, Rule
from sluice.policies.snapshot import ALLOW, BLOCK, Match, Snapshot
from sluice.records import record

__all__ = ["ALLOW_ALL", "DENY_ALL", "TOKEN_BUCKET", "BucketIndex", "Governed", "ambiguous_chains"]

# Governed.kind: a token bucket of the rule's rate, or a blanket rule.
TOKEN_BUCKET, ALLOW_ALL, DENY_ALL = range(3)


@record
class Governed:
    """What one bucket is given before sharing: ``rate_per_s`` and ``burst`` for the whole
    limit (every stream together), under ``share_key``; or a blanket rule. ``rule_id`` names
    the rule in usage and logs ("" when no rule matched)."""

    kind: int
    rule_id: str = ""
    share_key: tuple[str, ...] = ()
    rate_per_s: float = 0.0
    burst: int = 0
    # When a pin (override, block, allow) in force here expires (Unix seconds): the bucket
    # is looked up again then. Infinity: nothing here expires.
    expires_at_s: float = math.inf


_ALLOW = Governed(ALLOW_ALL)


class BucketIndex:
    """A snapshot's rule chains by key set, built once per snapshot."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot = snapshot
        # domain -> frozenset of keys -> the chain's key order
        self._orders: dict[str, dict[frozenset[str], tuple[str, ...]]] = {}
        for policy in snapshot.policies:
            orders: dict[frozenset[str], tuple[str, ...]] = {}
            for keys, _ in _chains(policy.descriptors, ()):
                orders.setdefault(frozenset(keys), keys)
            self._orders[policy.domain] = orders

    def has_domain(self, domain: str) -> bool:
        return domain in self._orders

    def entries(self, domain: str, bucket: Mapping[str, str]) -> tuple[tuple[str, str], ...] | None:
        """The bucket as a descriptor's entries, in its rule chain's order; None: no chain."""
        order = self._orders.get(domain, {}).get(frozenset(bucket))
        if order is None:
            return None
        return tuple((key, bucket[key]) for key in order)

    def govern(self, domain: str, bucket: Mapping[str, str], now_s: float) -> Governed:
        """What the domain's policy gives ``bucket`` at ``now_s``: ALLOW_ALL where no rule
        applies (as ShouldRateLimit answers OK), DENY_ALL for a limit of 0 or a block."""
        entries = self.entries(domain, bucket)
        if entries is None:
            return _ALLOW
        pin = self.snapshot.pins(domain).get(entries)
        if pin is not None and pin.expires_at_s > now_s:
            if pin.kind == BLOCK:
                return Governed(DENY_ALL, pin.match.rule_id, expires_at_s=pin.expires_at_s)
            if pin.kind == ALLOW:
                return Governed(ALLOW_ALL, pin.match.rule_id, expires_at_s=pin.expires_at_s)
            return _governed(pin.match, pin.expires_at_s)
        match = self.snapshot.lookup(domain, entries)
        if match is None:
            return _ALLOW
        return _governed(match, math.inf)


def _governed(match: Match, expires_at_s: float) -> Governed:
    if match.unlimited or match.shadow_mode or not match.limits:
        return Governed(ALLOW_ALL, match.rule_id, expires_at_s=expires_at_s)
    # Several limits on one rule: the one that admits least per second governs.
    limit = min(match.limits, key=lambda x: x.requests_per_unit / x.period_s)
    if limit.requests_per_unit <= 0:
        return Governed(DENY_ALL, match.rule_id, expires_at_s=expires_at_s)
    return Governed(
        TOKEN_BUCKET,
        match.rule_id,
        match.counter_key,
        limit.requests_per_unit / limit.period_s,
        max(1, limit.burst),
        expires_at_s,
    )


def _chains(rules: Iterable[Rule], keys: tuple[str, ...]) -> Iterator[tuple[tuple[str, ...], Rule]]:
    """Every rule that applies a limit, with the keys of its chain (root first). A chain that
    repeats a key cannot be a bucket (a map has each key once) and is left out."""
    for rule in rules:
        if rule.key in keys:
            continue
        chain = (*keys, rule.key)
        if rule.applies_limit:
            yield chain, rule
        yield from _chains(rule.descriptors, chain)


def ambiguous_chains(policy: DomainPolicy) -> list[tuple[Rule, tuple[str, ...], tuple[str, ...]]]:
    """Rules whose chain has the same keys as an earlier rule's chain in another order: each
    with its own order and the earlier one's."""
    first: dict[frozenset[str], tuple[str, ...]] = {}
    clashes = []
    for keys, rule in _chains(policy.descriptors, ()):
        seen = first.setdefault(frozenset(keys), keys)
        if seen != keys:
            clashes.append((rule, keys, seen))
    return clashes
