"""Moves what the recorder counted into the usage store, once a second, off the request path.

A failed flush keeps its figures and adds them to the next one, so a store outage loses
nothing (up to a bound) and double-counts at most one flush: a transaction whose commit
succeeded but whose answer was lost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from sluice.clock import Clock
from sluice.errors import SluiceError
from sluice.periodic import Periodic
from sluice.usage.recorder import RuleUsage, UsageRecorder
from sluice.usage.store import UsageStore

__all__ = ["UsageFlusher"]

log = logging.getLogger(__name__)

_EXPIRE_EVERY = 60  # flushes


class UsageFlusher:
    def __init__(
        self,
        recorder: UsageRecorder,
        store: UsageStore,
        clock: Clock,
        *,
        interval_s: float = 1.0,
        max_pending: int = 100_000,
        on_drain: Callable[[dict[str, RuleUsage]], None] | None = None,
    ) -> None:
        self._recorder = recorder
        self._store = store
        self._clock = clock
        self._max_pending = max_pending
        self._on_drain = on_drain
        self._counts: dict[tuple[str, int], list[int]] = {}
        self._offenders: dict[tuple[str, int], dict[str, int]] = {}
        self._flushes = 0
        self._periodic = Periodic("usage flush", interval_s, self.flush_once)
        self.failures = 0
        self.dropped = 0
        self.store_up = True

    def collect(self) -> None:
        """Take what the recorder holds, stamped with the current second."""
        drained = self._recorder.drain()
        if self._on_drain is not None and drained:
            self._on_drain(drained)
        second = int(self._clock.now())
        minute = second - second % 60
        for rule, usage in drained.items():
            target = self._counts.get((rule, second))
            if target is None:
                if len(self._counts) >= self._max_pending:
                    self.dropped += 1
                    continue
                target = self._counts[(rule, second)] = [0] * len(usage.counts)
            for i, n in enumerate(usage.counts):
                target[i] += n
            if usage.offenders is not None:
                keys = self._offenders.setdefault((rule, minute), {})
                for key, hits in usage.offenders.top():
                    keys[key] = keys.get(key, 0) + hits

    async def flush_once(self) -> bool:
        self.collect()
        if not self._counts and not self._offenders:
            return True
        counts, offenders = self._counts, self._offenders
        try:
            await asyncio.to_thread(self._store.add, counts, offenders)
        except SluiceError as exc:
            self.failures += 1
            if self.store_up:
                log.warning("usage store unreachable; keeping figures for later: %s", exc)
            self.store_up = False
            return False
        if not self.store_up:
            log.warning("usage store reachable again")
        self.store_up = True
        # Only what was sent is cleared: collect() may not run while add() is in its thread.
        if self._counts is counts:
            self._counts, self._offenders = {}, {}
        self._flushes += 1
        if self._flushes % _EXPIRE_EVERY == 0:
            try:
                await asyncio.to_thread(self._store.expire, int(self._clock.now()))
            except SluiceError as exc:
                log.warning("could not expire old usage: %s", exc)
        return True

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()
        await self.flush_once()  # what the last second counted
