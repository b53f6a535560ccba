"""``sluice migrate-counters``: move envoyproxy/ratelimit's fixed-window counters into Sluice's.

Upstream keeps one Redis string per descriptor and window,
``<prefix><domain>_<key1>_<value1>_..._<window start>``, incremented with INCRBY and given an
expiry. This reads each such key, works out which rule it counts for by matching it against
the policies (the name alone is ambiguous: a domain, key or value may hold ``_``), and adds
its count to the Sluice counter of the same descriptor and window, so a limit that was
nearly used up on upstream stays nearly used up on Sluice.

A key is *moved*: its count is added (HINCRBY, or a fresh window) and the upstream key is
deleted (GETDEL first, so a count is never added twice however often this runs). Running it
again during a cut-over moves only what upstream counted since (docs/migrating.md,
"Cut-over"). Only fixed windows are moved (upstream has no other algorithm); keys of a window
already over, of no rule, or of a rule whose limit is not a fixed window are left alone.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sluice.backends.redis.keys import KeyNamer
from sluice.model import DomainPolicy, Rule
from sluice.policies.snapshot import Match, Snapshot

__all__ = ["MigrationReport", "UpstreamCounter", "migrate_counters", "parse_upstream_key"]

# Adds a moved count to Sluice's fixed-window state (a hash: w = window start, c = count),
# as lua/fixed_window.lua keeps it: the same window adds up, an older or missing one starts
# afresh with the moved count and expires when the window ends.
_ADD = """
local start = tonumber(ARGV[1])
local stored = redis.call('HGET', KEYS[1], 'w')
if stored and tonumber(stored) == start then
  return redis.call('HINCRBY', KEYS[1], 'c', ARGV[2])
end
redis.call('HSET', KEYS[1], 'w', ARGV[1], 'c', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return tonumber(ARGV[2])
"""


@dataclass(frozen=True)
class UpstreamCounter:
    """One upstream key understood: the rule's match and the window it counts."""

    key: str
    match: Match
    window_start: int
    period_s: int


@dataclass
class MigrationReport:
    moved: int = 0  # keys moved
    hits: int = 0  # their counts, summed
    skipped: dict[str, int] = field(default_factory=dict)  # why -> how many keys

    def skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items())) or "none"
        return f"moved {self.moved} counters ({self.hits} hits); skipped: {skipped}"


def parse_upstream_key(
    key: str, prefix: str, snapshot: Snapshot, keys_by_domain: dict[str, set[str]]
) -> UpstreamCounter | None:
    """The rule and window an upstream key counts for, or None when no fixed-window rule of
    ``snapshot`` gives that name. ``keys_by_domain``: every descriptor key of each domain's
    rules (``descriptor_keys``), which bounds the search for where values end."""
    if not key.startswith(prefix):
        return None
    head, _, start_text = key[len(prefix) :].rpartition("_")
    if not start_text.isdigit():
        return None
    start = int(start_text)
    for domain, known in keys_by_domain.items():
        if not head.startswith(domain + "_"):
            continue
        for entries in _splits(head[len(domain) + 1 :], known):
            match = snapshot.lookup(domain, entries)
            if match is None:
                continue
            for limit in match.limits:
                if limit.algorithm.counts_refused and start % limit.period_s == 0:
                    return UpstreamCounter(key, match, start, limit.period_s)
    return None


def descriptor_keys(policies: Iterable[DomainPolicy]) -> dict[str, set[str]]:
    def walk(rules: Iterable[Rule], into: set[str]) -> set[str]:
        for rule in rules:
            into.add(rule.key)
            walk(rule.descriptors, into)
        return into

    return {policy.domain: walk(policy.descriptors, set()) for policy in policies}


def _splits(rest: str, known: set[str]) -> Iterator[tuple[tuple[str, str], ...]]:
    """Every way to read ``rest`` as ``key_value_key_value...`` with keys from ``known``
    (values may hold ``_``)."""
    for key in known:
        if not rest.startswith(key + "_"):
            continue
        after = rest[len(key) + 1 :]
        yield ((key, after),)  # the value runs to the end
        at = after.find("_")
        while at != -1:
            for tail in _splits(after[at + 1 :], known):
                yield ((key, after[:at]), *tail)
            at = after.find("_", at + 1)


async def migrate_counters(
    client: Any,
    policies: list[DomainPolicy],
    *,
    upstream_prefix: str,
    sluice_prefix: str,
    now: float,
) -> MigrationReport:
    """Move every live upstream fixed-window counter under ``upstream_prefix`` into Sluice's
    keys under ``sluice_prefix`` (``client``: redis-py's asyncio client, standalone, Sentinel
    or Cluster)."""
    snapshot = Snapshot(policies)
    known = descriptor_keys(policies)
    namer = KeyNamer(sluice_prefix)
    report = MigrationReport()
    add = client.register_script(_ADD)
    async for raw in client.scan_iter(match=_glob_escape(upstream_prefix) + "*", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else raw
        if not key.rpartition("_")[2].isdigit():
            continue  # not named as upstream names counters (Sluice's own end in ":<period>")
        counter = parse_upstream_key(key, upstream_prefix, snapshot, known)
        if counter is None:
            report.skip("keys of no fixed-window rule")
            continue
        end = counter.window_start + counter.period_s
        if end <= now:
            report.skip("keys of a window already over")
            continue
        value = await client.getdel(key)
        if value is None:
            continue  # expired, or moved by a concurrent run
        count = int(value)
        limits = tuple(x for x in counter.match.limits if x.period_s == counter.period_s)
        target = namer.keys(counter.match.counter_key, limits[:1])[0]
        ttl_ms = max(1, math.ceil((end - now) * 1000))
        await add(keys=[target], args=[counter.window_start, count, ttl_ms])
        report.moved += 1
        report.hits += count
    return report


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
