"""One second of a rule's per-key hits, summarised to a bounded size: what the what-if replays.

The ``top`` heaviest keys of the second are kept exactly (their hits by key); every other key
is only counted, in a histogram of hits per key whose bins are exact up to ``EXACT_UP_TO`` and
then two per doubling (8, 12, 16, 24, 32, 48, …). A bin keeps how many keys fell in it and
their hits, so the totals stay exact and only which key sent what is lost. The size is at
most ``top`` keys plus two bins per doubling of the busiest key's hits, whatever the traffic.

Done at flush time, once a second per rule, from the counts the recorder keeps per key: no
work on the request path beyond one dict increment.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping
from dataclasses import dataclass, field

__all__ = ["EXACT_UP_TO", "KeySummary", "bin_of", "bin_upper", "key_name", "summarize"]

EXACT_UP_TO = 8


@dataclass
class KeySummary:
    top: dict[str, int] = field(default_factory=dict)  # key name -> hits
    bins: dict[int, list[int]] = field(default_factory=dict)  # bin floor -> [keys, hits]

    def add(self, other: KeySummary) -> None:
        """Fold ``other`` (the same rule and second, counted by a later drain) into this one.
        A key kept in one and binned in the other stays split: both still add up exactly."""
        for key, hits in other.top.items():
            self.top[key] = self.top.get(key, 0) + hits
        for floor, (keys, hits) in other.bins.items():
            target = self.bins.setdefault(floor, [0, 0])
            target[0] += keys
            target[1] += hits


def key_name(counter_key: tuple[str, ...]) -> str:
    """A counter as stored: its ``key,value,…`` after the domain (as offenders are named)."""
    return ",".join(counter_key[1:])


def bin_of(hits: int) -> int:
    """The floor of the histogram bin ``hits`` falls in."""
    if hits <= EXACT_UP_TO:
        return hits
    power = 1 << (hits.bit_length() - 1)
    half = power + power // 2
    return half if hits >= half else power


def bin_upper(floor: int) -> int:
    """The most hits a key in the bin starting at ``floor`` can have."""
    if floor < EXACT_UP_TO:
        return floor
    if floor & (floor - 1) == 0:  # a power of two: the bin runs to one and a half times it
        return floor + floor // 2 - 1
    return floor // 3 * 4 - 1  # one and a half times a power of two: to the next power


def summarize(counts: Mapping[tuple[str, ...], int], *, top: int) -> KeySummary:
    """The ``top`` heaviest counters of ``counts`` by name, the rest binned."""
    summary = KeySummary()
    if len(counts) <= top:
        heaviest = list(counts.items())
    else:
        heaviest = heapq.nlargest(top, counts.items(), key=lambda item: item[1])
    kept = set()
    for counter_key, hits in heaviest:
        name = key_name(counter_key)
        summary.top[name] = summary.top.get(name, 0) + hits
        kept.add(counter_key)
    if len(kept) < len(counts):
        for counter_key, hits in counts.items():
            if counter_key not in kept:
                target = summary.bins.setdefault(bin_of(hits), [0, 0])
                target[0] += 1
                target[1] += hits
    return summary
