"""Per-rule usage counters, aggregated in memory on the request path.

Recording is a dict lookup and an integer increment; everything else (flushing, merging
instances, history) happens off the request path, on whatever ``drain()`` returns.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from sluice.usage.heavy_hitters import SpaceSaving

__all__ = [
    "ALLOWED",
    "near_threshold",
    "BACKEND_ERROR",
    "BLOCKED",
    "MAX_KEYS_PER_DRAIN",
    "NEAR_LIMIT",
    "OVER_LIMIT",
    "SHADOW_OVER",
    "RuleUsage",
    "UsageRecorder",
]

# One hit counts at most this much (one more than the largest limit, which such a hit can
# never fit): Envoy's hits_addend is a uint64, and a few of those would overflow the 64-bit
# integers of the usage tables, failing every later flush of the figures they are in.
MAX_RECORDED_COST = 2**32

# Distinct limits whose near-limit threshold is remembered (clients' own limits can be many).
MAX_THRESHOLDS = 4096

# Distinct counters counted per rule between two drains (a second): enough for every key of a
# busy rule, a bound for a flood of made-up values. Hits of keys past it are in the rule's
# totals only: the what-if widens its error bound by what the keys do not account for.
MAX_KEYS_PER_DRAIN = 100_000

# Indexes into RuleUsage.counts. BLOCKED: refused by an operator's block, nothing counted.
ALLOWED, OVER_LIMIT, SHADOW_OVER, NEAR_LIMIT, BACKEND_ERROR, BLOCKED = range(6)
COUNTER_NAMES = (
    "allowed",
    "over_limit",
    "shadow_over_limit",
    "near_limit",
    "backend_errors",
    "blocked",
)


@dataclass
class RuleUsage:
    counts: list[int] = field(default_factory=lambda: [0] * len(COUNTER_NAMES))
    offenders: SpaceSaving | None = None  # over-limit keys (concrete descriptor values)
    local_refusals: int = 0  # of the over-limit hits, those the local cache refused
    # Hits per counter (its key tuple: domain, key, value, …), admitted and refused alike: what
    # the what-if replays per key. Summarised off the request path (usage/key_summary.py).
    keys: dict[tuple[str, ...], int] = field(default_factory=dict)


class UsageRecorder:
    """``named``: also keep, apart, the hits whose statsd name is not their rule's
    (``record_named``), for envoyproxy/ratelimit's statsd names; off, that is a no-op."""

    def __init__(
        self,
        *,
        near_limit_ratio: float = 0.8,
        top_keys: int = 20,
        named: bool = False,
        max_keys: int = MAX_KEYS_PER_DRAIN,
    ) -> None:
        self.near_limit_ratio = near_limit_ratio
        self.top_keys = top_keys
        self.max_keys = max_keys
        self.named = named
        self._rules: dict[str, RuleUsage] = {}
        self._named: dict[tuple[str, str], RuleUsage] = {}
        self._thresholds: dict[int, int] = {}

    def record(
        self,
        rule_id: str,
        kind: int,
        *,
        cost: int = 1,
        offender: str | None = None,
        near: int = 0,
        local: bool = False,
        key: tuple[str, ...] | None = None,
    ) -> None:
        """``near``: how many of the hits were near the limit (``near_hits``). ``key``: the
        counter the hits went to, counted per key (one dict increment: the only per-key work
        on the request path)."""
        usage = self._rules.get(rule_id)
        if usage is None:
            usage = self._rules[rule_id] = RuleUsage()
        if cost > MAX_RECORDED_COST:
            cost = MAX_RECORDED_COST
        usage.counts[kind] += cost
        if key is not None:
            keys = usage.keys
            seen = keys.get(key)
            if seen is not None:
                keys[key] = seen + cost
            elif len(keys) < self.max_keys:
                keys[key] = cost
        if near:
            usage.counts[NEAR_LIMIT] += min(near, cost)
        if local:
            usage.local_refusals += cost
        if offender is not None:
            if usage.offenders is None:
                usage.offenders = SpaceSaving(self.top_keys)
            usage.offenders.add(offender, cost)

    def record_named(
        self,
        rule_id: str,
        name: str,
        kind: int,
        *,
        cost: int = 1,
        near: int = 0,
        local: bool = False,
    ) -> None:
        """The hit just ``record``ed under ``rule_id``, as statsd is to name it: ``name``
        (request values in it), or nothing at all for ``""``. Kept apart from the rules' own
        counts, which stay per rule (Prometheus labels, the usage store: bounded)."""
        if not self.named:
            return
        usage = self._named.get((rule_id, name))
        if usage is None:
            usage = self._named[(rule_id, name)] = RuleUsage()
        if cost > MAX_RECORDED_COST:
            cost = MAX_RECORDED_COST
        usage.counts[kind] += cost
        if near:
            usage.counts[NEAR_LIMIT] += min(near, cost)
        if local:
            usage.local_refusals += cost

    def near_hits(self, requests_per_unit: int, remaining: int, cost: int) -> int:
        """Of an admitted hit of ``cost`` that left ``remaining``, how many hits are near the
        limit, as envoyproxy/ratelimit counts them: those past its threshold,
        ``floor(limit × ratio)`` in float32 arithmetic (``near_threshold``), so a hit of
        cost n crossing it counts only its part past it."""
        after = requests_per_unit - remaining
        # Far below the threshold, as most hits are: no need to know it exactly (float32
        # differs from this float64 estimate by less than a millionth of it).
        if after < requests_per_unit * self.near_limit_ratio * 0.999999 - 1:
            return 0
        threshold = self._thresholds.get(requests_per_unit)
        if threshold is None:
            if len(self._thresholds) >= MAX_THRESHOLDS:
                self._thresholds.clear()
            threshold = near_threshold(requests_per_unit, self.near_limit_ratio)
            self._thresholds[requests_per_unit] = threshold
        if after <= threshold:
            return 0
        return cost if after - cost >= threshold else after - threshold

    def drain(self) -> dict[str, RuleUsage]:
        """Everything recorded since the last drain; recording continues into a fresh map."""
        drained, self._rules = self._rules, {}
        return drained

    def drain_named(self) -> dict[tuple[str, str], RuleUsage]:
        """What ``record_named`` kept since the last call, by (rule id, name); drained with
        ``drain`` in one step of the event loop, so each holds the same hits."""
        drained, self._named = self._named, {}
        return drained


def near_threshold(requests_per_unit: int, ratio: float) -> int:
    """envoyproxy/ratelimit's near-limit threshold: ``floor(float32(limit) × float32(ratio))``
    with the product rounded to float32, as Go computes it (0.7 × 10 is 7 there, 6 in
    float64)."""
    product = _float32(_float32(float(requests_per_unit)) * _float32(ratio))
    return math.floor(product)


def _float32(value: float) -> float:
    result: float = struct.unpack("f", struct.pack("f", value))[0]
    return result
