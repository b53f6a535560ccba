"""A local cache of refusals in front of any backend, so a flood on a counter that is already
over its limit stops costing round trips.

When the inner backend refuses a hit and says how long the refusal lasts (the longest
``reset_s`` of the limits that refused it; they are "never early"), hits on the same
counter with the same limits and the same cost are refused here until then, without asking
the inner backend. It only ever refuses, never admits, and only what the inner backend would
refuse too: state changes by other hits can only consume capacity, never free it early. So
exactness holds. Such changes can lengthen the wait, though: a hit on the counter that does
reach the inner backend drops what is remembered for it. (Hits through other Sluice
instances sharing a Redis can lengthen it too, unseen here: the wait reported is then the one
this instance last saw.) (A larger cost would be refused too, but its wait, and whether it can ever
fit, differ from the remembered ones: those go to the inner backend.) Fixed
windows count refused hits too, so a refusal is only remembered while every fixed window of
the hit is itself over its limit (then the hits answered here, which those windows do not
count, change no later decision), and never past the end of such a window. Each answer is
the remembered one with its waits shortened by the time passed; its ``remaining`` is the one
of the refusal it remembers, which never exceeds the true one (a refused counter only gains
capacity with time).

Shadow mode needs nothing here: the limiter turns a shadow rule's refusal into OK and
records it as a shadow refusal whether the refusal came from here or from the inner backend;
the wrapped backend never decides what a client is told.

A hit refused because it can never fit (``fits`` false, no wait) is not cached. Entries
are kept in LRU order up to ``max_keys`` and dropped once they run out.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import replace

from sluice.algorithms import Limit, Outcome
from sluice.backends import Backend, Hit

__all__ = ["OverLimitCache"]

_Key = tuple[tuple[str, ...], tuple[Limit, ...]]


class _Refusal:
    __slots__ = ("at", "cost", "outcomes", "until")

    def __init__(self, at: float, until: float, cost: int, outcomes: tuple[Outcome, ...]):
        self.at = at
        self.until = until
        self.cost = cost
        self.outcomes = outcomes


class OverLimitCache:
    def __init__(self, inner: Backend, *, max_keys: int = 100_000) -> None:
        if max_keys < 1:
            raise ValueError("max_keys must be at least 1")
        self.inner = inner
        self.max_keys = max_keys
        self._refusals: OrderedDict[_Key, _Refusal] = OrderedDict()
        self.local_refusals = 0  # hits answered here
        self.evictions = 0

    def __len__(self) -> int:
        return len(self._refusals)

    async def apply(self, hits: Sequence[Hit], now: float) -> list[tuple[Outcome, ...]]:
        refusals = self._refusals
        if not refusals:  # the common case costs one check
            outcomes = await self.inner.apply(hits, now)
            self._remember(hits, outcomes, now)
            return outcomes
        local: dict[int, tuple[Outcome, ...]] = {}
        for i, hit in enumerate(hits):
            key = (hit.counter_key, hit.limits)
            refusal = refusals.get(key)
            if refusal is None:
                continue
            if now >= refusal.until:
                del refusals[key]
            elif hit.cost == refusal.cost:
                refusals.move_to_end(key)
                local[i] = _aged(refusal, now)
        if not local:
            outcomes = await self.inner.apply(hits, now)
            self._remember(hits, outcomes, now)
            return outcomes
        self.local_refusals += len(local)
        rest = [hit for i, hit in enumerate(hits) if i not in local]
        remote = iter(await self.inner.apply(rest, now) if rest else ())
        merged = [local[i] if i in local else next(remote) for i in range(len(hits))]
        self._remember(rest, [o for i, o in enumerate(merged) if i not in local], now)
        return merged

    def metric_values(self) -> dict[str, float]:
        return {**self.inner.metric_values(), "local_cache_refusals": self.local_refusals}

    async def close(self) -> None:
        self._refusals.clear()
        await self.inner.close()

    def _remember(
        self, hits: Sequence[Hit], outcomes: Sequence[tuple[Outcome, ...]], now: float
    ) -> None:
        for hit, per_limit in zip(hits, outcomes, strict=True):
            wait = 0.0
            for outcome in per_limit:
                if not outcome.allowed and outcome.fits and outcome.reset_s > wait:
                    wait = outcome.reset_s
            # A fixed window counts every hit, refused ones too, and later decisions depend on
            # that count. Answering here is only exact while each such limit of the hit is
            # itself over its limit: then more counting changes nothing until it ends.
            for limit, outcome in zip(hit.limits, per_limit, strict=True):
                if limit.algorithm.counts_refused:
                    wait = min(wait, outcome.reset_s) if not outcome.allowed else 0.0
            key = (hit.counter_key, hit.limits)
            if wait <= 0.0:
                # This hit reached the backend and may have consumed capacity: a refusal
                # remembered for another cost could now wait longer than remembered.
                if self._refusals:
                    self._refusals.pop(key, None)
                continue
            # Marked as this cache's answers, which the statistics count apart (upstream's
            # over_limit_with_local_cache), and wholly over the limit: none of a hit answered
            # here is counted by a window, let alone below its limit.
            local = tuple(replace(o, local=True, below_limit=0) for o in per_limit)
            self._refusals[key] = _Refusal(now, now + wait, hit.cost, local)
            self._refusals.move_to_end(key)
            if len(self._refusals) > self.max_keys:
                self._refusals.popitem(last=False)
                self.evictions += 1


def _aged(refusal: _Refusal, now: float) -> tuple[Outcome, ...]:
    """The remembered outcomes as they read ``now``: every wait shorter by the time passed."""
    elapsed = now - refusal.at
    if elapsed <= 0:
        return refusal.outcomes
    return tuple(replace(o, reset_s=max(o.reset_s - elapsed, 0.0)) for o in refusal.outcomes)
