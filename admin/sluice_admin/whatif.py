"""What a limit would have admitted: traffic replayed through the server's own step functions.

Recorded traffic is replayed **per key** (``predict``), as the server decides it: each key
its own counter, a key's ``n`` requests of a second at independent instants within it
(uniform, from a fixed seed: the same recording always gives the same figures), as requests
from many clients arrive. Even spacing would flatter the algorithms that look inside the
second (a sliding log most): random arrivals bunch.
The usage store keeps each second's heaviest keys by name (``usage_keys``) and the others as a
histogram of hits per key (``usage_key_bins``); the named keys replay exactly, the others
between two groupings of the histogram, which gives the error bound (docs/admin.md):

- each of them a new key every second (no history: the most any key could be admitted), and
- the n-th busiest of one second the same key as the n-th busiest of the next (the most
  concentrated their hits could be, so the fewest admitted).

The prediction is the middle of the two, and the bound half the gap; hits the rule's totals
hold beyond what the keys account for (a server without per-key figures) could go either way
and widen it by half their number. Recordings with no per-key figures at all are replayed as
if every request of the rule hit **one counter** (``simulate``): for a per-client rule, the
worst case.
"""

from __future__ import annotations

import math
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.algorithms import Limit
from sluice.model import RateLimit
from sluice.policies.snapshot import compile_limit
from sluice.usage.store import KeyRecord, UsagePoint

__all__ = [
    "MAX_REPLAY_HITS",
    "KeyTraffic",
    "Replay",
    "Second",
    "bursty",
    "key_traffic",
    "limits_of",
    "predict",
    "recorded",
    "simulate",
    "spread",
    "steady",
]

# Hits stepped one by one in Python: about a second of work. Above it the oldest seconds
# are left out (and the result says so) rather than making the page hang.
MAX_REPLAY_HITS = 300_000

Traffic = list[tuple[int, int]]  # (second, requests in that second), ascending


@dataclass(frozen=True)
class Second:
    second: int
    admitted: int
    rejected: int


@dataclass(frozen=True)
class Replay:
    seconds: list[Second]
    skipped_hits: int = 0  # left out to stay under MAX_REPLAY_HITS (the oldest ones)
    # How far the admitted (and so the rejected) count could be off, from what the recording
    # does not say per key; 0 for synthetic traffic and for the keys replayed by name.
    error_bound: int = 0

    @property
    def admitted(self) -> int:
        return sum(s.admitted for s in self.seconds)

    @property
    def rejected(self) -> int:
        return sum(s.rejected for s in self.seconds)

    @property
    def rejection_rate(self) -> float:
        total = self.admitted + self.rejected
        return self.rejected / total if total else 0.0


def limits_of(limits: Iterable[RateLimit]) -> list[Limit]:
    """Rule limits as the algorithms take them (burst defaulting to the limit, as served)."""
    return [compile_limit(x) for x in limits]


def recorded(points: Iterable[UsagePoint]) -> Traffic:
    """Requests per second as recorded: admitted + refused + refused-in-shadow-mode.

    Backend errors are left out: those requests were never decided.
    """
    out = [(p.bucket_s, p.allowed + p.over_limit + p.shadow_over_limit) for p in points]
    return [(s, n) for s, n in out if n > 0]


def steady(rate_per_s: float, duration_s: int, *, start_s: int = 0) -> Traffic:
    """``rate_per_s`` on average every second (fractional rates spread: 0.5/s is one every
    other second)."""
    return [
        (start_s + t, math.floor((t + 1) * rate_per_s) - math.floor(t * rate_per_s))
        for t in range(duration_s)
    ]


def bursty(burst: int, every_s: int, duration_s: int, *, start_s: int = 0) -> Traffic:
    """``burst`` requests in the first second of every ``every_s``, nothing in between."""
    return [(start_s + t, burst if t % every_s == 0 else 0) for t in range(duration_s)]


def simulate(
    limits: Sequence[Limit],
    traffic: Traffic,
    *,
    max_hits: int = MAX_REPLAY_HITS,
    arrivals: random.Random | None = None,
) -> Replay:
    """Replay ``traffic`` through one counter per limit, as the memory backend applies them:
    a hit is admitted iff every limit admits it; a refused hit changes no state, except that
    fixed windows count every hit. A second's ``n`` hits come evenly spaced (``s + i/n``),
    or with ``arrivals`` at instants drawn from it, as independent requests arrive."""
    traffic, skipped = _budget(traffic, max_hits)
    states: list[Any] = [None] * len(limits)
    seconds = []
    for second, n in traffic:
        admitted = 0
        if arrivals is None:
            instants: Iterable[float] = (second + i / n for i in range(n))
        else:
            instants = sorted(second + arrivals.random() for _ in range(n))
        for now in instants:
            stepped = [x.algorithm.step(s, x, now, 1) for s, x in zip(states, limits, strict=True)]
            ok = all(outcome.allowed for _, outcome in stepped)
            for j, ((new, _), limit) in enumerate(zip(stepped, limits, strict=True)):
                if ok or limit.algorithm.counts_refused:
                    states[j] = new
            admitted += ok
        seconds.append(Second(second, admitted, n - admitted))
    return Replay(seconds, skipped)


def _budget(traffic: Traffic, max_hits: int) -> tuple[Traffic, int]:
    """The most recent seconds whose hits fit in ``max_hits``; and how many were left out."""
    total, keep = 0, len(traffic)
    for index in range(len(traffic) - 1, -1, -1):
        if total + traffic[index][1] > max_hits:
            break
        total += traffic[index][1]
        keep = index
    else:
        return traffic, 0
    skipped = sum(n for _, n in traffic[:keep])
    return traffic[keep:], skipped


@dataclass(frozen=True)
class KeyTraffic:
    """A rule's recorded traffic, per key as far as the recording says.

    ``named``: each named key's (second, hits), ascending. ``rest``: per second, the hits of
    each other key, largest first. ``unaccounted``: per second, hits in the rule's totals
    that neither holds.
    """

    named: dict[str, Traffic] = field(default_factory=dict)
    rest: dict[int, list[int]] = field(default_factory=dict)
    unaccounted: Traffic = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.named and not self.rest

    @property
    def rest_hits(self) -> int:
        return sum(sum(counts) for counts in self.rest.values())


def spread(keys: int, hits: int) -> list[int]:
    """``hits`` over ``keys`` keys as evenly as whole hits go, largest first."""
    each, extra = divmod(hits, keys)
    return [each + 1] * extra + [each] * (keys - extra)


def key_traffic(record: KeyRecord, totals: Traffic) -> KeyTraffic:
    """What the usage store holds per key for a rule, against the rule's totals per second
    (``recorded``)."""
    named: dict[str, Traffic] = defaultdict(list)
    counted: dict[int, int] = defaultdict(int)
    for second, key, hits in record.keys:
        named[key].append((second, hits))
        counted[second] += hits
    rest: dict[int, list[int]] = defaultdict(list)
    for second, _, keys, hits in record.bins:
        if keys > 0:
            rest[second].extend(spread(keys, hits))
            counted[second] += hits
    for counts in rest.values():
        counts.sort(reverse=True)
    unaccounted = [(s, n - counted[s]) for s, n in totals if n > counted[s]]
    return KeyTraffic(dict(named), dict(rest), unaccounted)


def predict(
    limits: Sequence[Limit], traffic: KeyTraffic, *, max_hits: int = MAX_REPLAY_HITS
) -> Replay:
    """``traffic`` replayed per key through ``limits`` (the module docstring says how, and
    what the error bound is)."""
    traffic, skipped = _budget_keys(traffic, max_hits)
    arrivals = random.Random(0)
    exact: dict[int, int] = defaultdict(int)  # admitted, of the named keys
    hits: dict[int, int] = defaultdict(int)
    for series in traffic.named.values():
        for s in simulate(limits, series, max_hits=max_hits, arrivals=arrivals).seconds:
            exact[s.second] += s.admitted
            hits[s.second] += s.admitted + s.rejected
    most, fewest = _rest_bounds(limits, traffic.rest, max_hits, arrivals)
    for second, counts in traffic.rest.items():
        hits[second] += sum(counts)
    unaccounted = dict(traffic.unaccounted)
    for second, n in unaccounted.items():
        hits[second] += n
    seconds, total, bound = [], 0.0, 0.0
    for second in sorted(hits):
        low = exact[second] + fewest.get(second, 0)
        high = exact[second] + most.get(second, 0) + unaccounted.get(second, 0)
        before = round(total)
        total += (low + high) / 2
        bound += (high - low) / 2
        admitted = round(total) - before  # rounded as a running total: the seconds add up
        seconds.append(Second(second, admitted, hits[second] - admitted))
    return Replay(seconds, skipped, math.ceil(bound))


def _rest_bounds(
    limits: Sequence[Limit], rest: dict[int, list[int]], max_hits: int, arrivals: random.Random
) -> tuple[dict[int, int], dict[int, int]]:
    """Admitted per second of the keys not named: most (each a new key every second), fewest
    (the n-th busiest of each second one and the same key)."""
    most: dict[int, int] = defaultdict(int)
    fresh: dict[int, int] = {}  # hits in a second from no history -> admitted
    for second, counts in rest.items():
        for n in counts:
            if n not in fresh:
                fresh[n] = simulate(limits, [(second, n)], arrivals=arrivals).admitted
            most[second] += fresh[n]
    fewest: dict[int, int] = defaultdict(int)
    seconds = sorted(rest)
    for rank in range(max((len(c) for c in rest.values()), default=0)):
        series = [(s, rest[s][rank]) for s in seconds if rank < len(rest[s])]
        for s in simulate(limits, series, max_hits=max_hits, arrivals=arrivals).seconds:
            fewest[s.second] += s.admitted
    return most, fewest


def _budget_keys(traffic: KeyTraffic, max_hits: int) -> tuple[KeyTraffic, int]:
    """The most recent seconds whose hits fit in ``max_hits``; and how many were left out."""
    per_second: dict[int, int] = defaultdict(int)
    for series in traffic.named.values():
        for second, n in series:
            per_second[second] += n
    for second, counts in traffic.rest.items():
        per_second[second] += sum(counts)
    kept, skipped = _budget(sorted(per_second.items()), max_hits)
    if not skipped:
        return traffic, 0
    since = kept[0][0] if kept else math.inf
    named = {k: [(s, n) for s, n in v if s >= since] for k, v in traffic.named.items()}
    return (
        KeyTraffic(
            {k: v for k, v in named.items() if v},
            {s: c for s, c in traffic.rest.items() if s >= since},
            [(s, n) for s, n in traffic.unaccounted if s >= since],
        ),
        skipped,
    )
