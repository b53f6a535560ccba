"""Per-rule usage counters, aggregated in memory on the request path.

Recording is a dict lookup and an integer increment; everything else (flushing, merging
instances, history) happens off the request path, on whatever ``drain()`` returns.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.usage.heavy_hitters import SpaceSaving

__all__ = [
    "ALLOWED",
    "BACKEND_ERROR",
    "BLOCKED",
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


class UsageRecorder:
    """``named``: also keep, apart, the hits whose statsd name is not their rule's
    (``record_named``), for envoyproxy/ratelimit's statsd names; off, that is a no-op."""

    def __init__(
        self, *, near_limit_ratio: float = 0.8, top_keys: int = 20, named: bool = False
    ) -> None:
        self.near_limit_ratio = near_limit_ratio
        self.top_keys = top_keys
        self.named = named
        self._rules: dict[str, RuleUsage] = {}
        self._named: dict[tuple[str, str], RuleUsage] = {}

    def record(
        self,
        rule_id: str,
        kind: int,
        *,
        cost: int = 1,
        offender: str | None = None,
        near: bool = False,
        local: bool = False,
    ) -> None:
        usage = self._rules.get(rule_id)
        if usage is None:
            usage = self._rules[rule_id] = RuleUsage()
        if cost > MAX_RECORDED_COST:
            cost = MAX_RECORDED_COST
        usage.counts[kind] += cost
        if near:
            usage.counts[NEAR_LIMIT] += cost
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
        near: bool = False,
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
            usage.counts[NEAR_LIMIT] += cost
        if local:
            usage.local_refusals += cost

    def is_near(self, requests_per_unit: int, remaining: int) -> bool:
        """At or past the near-limit share of the limit (80 % used by default)."""
        used = requests_per_unit - remaining
        return requests_per_unit > 0 and used >= self.near_limit_ratio * requests_per_unit

    def drain(self) -> dict[str, RuleUsage]:
        """Everything recorded since the last drain; recording continues into a fresh map."""
        drained, self._rules = self._rules, {}
        return drained

    def drain_named(self) -> dict[tuple[str, str], RuleUsage]:
        """What ``record_named`` kept since the last call, by (rule id, name); drained with
        ``drain`` in one step of the event loop, so each holds the same hits."""
        drained, self._named = self._named, {}
        return drained
