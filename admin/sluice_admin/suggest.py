"""Suggested limits: how fast each key of a rule has gone at its busiest, and the limit per
second that only the fastest X % of keys would have exceeded.

A key's peak rate is the most hits it sent in one second of the window. The keys the usage
store names (each second's heaviest) have theirs exactly; the others are known only as a
histogram per second, so they are counted from the second with the most of them, each at its
share of its bin's hits: a floor on how many keys there were and on their peaks. The fastest
keys, the ones a suggestion is about, are the named ones.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from sluice.usage.store import KeyRecord
from sluice_admin.whatif import spread

__all__ = ["PeakRates", "peak_rates", "suggested_limit"]


@dataclass(frozen=True)
class PeakRates:
    """Each key's peak hits in one second, highest first; the first ``named`` by name."""

    peaks: list[int]
    named: int

    @property
    def keys(self) -> int:
        return len(self.peaks)

    def percentile(self, p: float) -> int:
        """The nearest-rank ``p``-th percentile (p in (0, 100]): at least p % of keys peaked
        at or below it."""
        if not self.peaks:
            return 0
        rank = max(1, math.ceil(p / 100 * len(self.peaks)))
        return self.peaks[len(self.peaks) - rank]


def peak_rates(record: KeyRecord) -> PeakRates:
    """From ``UsageStore.key_record`` at either resolution (a minute's rows hold its peak)."""
    named: dict[str, int] = {}
    for _, key, hits in record.keys:
        if hits > named.get(key, 0):
            named[key] = hits
    by_bucket: dict[int, list[int]] = defaultdict(list)
    for bucket, _, keys, hits in record.bins:
        if keys > 0:
            by_bucket[bucket].extend(spread(keys, hits))
    rest = max(by_bucket.values(), key=len, default=[])
    return PeakRates(sorted([*named.values(), *rest], reverse=True), len(named))


def suggested_limit(rates: PeakRates, refuse_top_pct: float) -> int | None:
    """The lowest requests per second that at most ``refuse_top_pct`` % of the keys exceeded
    at their peak (so a per-second limit of it refuses no other key); None without keys."""
    if not rates.peaks:
        return None
    refused = math.floor(rates.keys * refuse_top_pct / 100)
    return rates.peaks[min(refused, rates.keys - 1)]
