"""Moves what the recorder counted into the usage store, once a second, off the request path.

A failed flush keeps its figures and adds them to the next one, so a store outage loses
nothing (up to a bound) and double-counts at most one flush: a transaction whose commit
succeeded but whose answer was lost. A store that hangs counts as down after ``timeout_s``;
the send under way is waited for, never repeated.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from sluice.clock import Clock
from sluice.errors import SluiceError
from sluice.periodic import Periodic
from sluice.usage.key_summary import KeySummary, summarize
from sluice.usage.recorder import RuleUsage, UsageRecorder
from sluice.usage.store import UsageStore

__all__ = ["UsageFlusher"]

log = logging.getLogger(__name__)

_EXPIRE_EVERY = 60  # flushes
# Keys of each rule kept by name per second (the rest only counted, in a histogram): enough
# for the heavy hitters a limit is about, bounded whatever the number of keys.
TOP_KEYS_PER_SECOND = 50


class UsageFlusher:
    def __init__(
        self,
        recorder: UsageRecorder,
        store: UsageStore,
        clock: Clock,
        *,
        interval_s: float = 1.0,
        max_pending: int = 100_000,
        timeout_s: float = 5.0,
        top_keys_per_second: int = TOP_KEYS_PER_SECOND,
        on_drain: Callable[[dict[str, RuleUsage]], None] | None = None,
    ) -> None:
        self._recorder = recorder
        self._store = store
        self._clock = clock
        self._max_pending = max_pending
        self._timeout_s = timeout_s
        self._on_drain = on_drain
        self._top_keys = top_keys_per_second
        self._counts: dict[tuple[str, int], list[int]] = {}
        self._offenders: dict[tuple[str, int], dict[str, int]] = {}
        self._keys: dict[tuple[str, int], KeySummary] = {}
        # Per-key counts drained but not yet summarised: that is done in the sending thread,
        # since a rule with 100,000 keys in a second takes ~50 ms to summarise.
        self._unsummarised: list[tuple[str, int, dict[tuple[str, ...], int]]] = []
        self._flushes = 0
        self._sending: asyncio.Future[bool] | None = None
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
            if usage.keys:
                self._unsummarised.append((rule, second, usage.keys))
            if usage.offenders is not None:
                keys = self._offenders.setdefault((rule, minute), {})
                for key, hits in usage.offenders.top():
                    keys[key] = keys.get(key, 0) + hits

    async def flush_once(self) -> bool:
        """Send what was counted; True when the store took it within ``timeout_s``.

        Safe to cancel, and safe when the store hangs: a send under way finishes in its
        thread whatever happens to the caller, its figures are cleared only once the store
        has them, and the next flush waits for it rather than sending them again (figures
        counted meanwhile wait in the recorder).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._timeout_s
        if self._sending is not None and not self._sending.done():
            await asyncio.wait([self._sending], timeout=self._timeout_s)
            if not self._sending.done():
                return self._no_answer()
        self._sending = asyncio.ensure_future(self._flush())
        self._sending.add_done_callback(_seen)
        try:
            return await asyncio.wait_for(
                asyncio.shield(self._sending), max(0.0, deadline - loop.time())
            )
        except TimeoutError:
            return self._no_answer()

    def _no_answer(self) -> bool:
        self.failures += 1
        if self.store_up:
            log.warning(
                "usage store: no answer within %gs; keeping figures for later", self._timeout_s
            )
        self.store_up = False
        return False

    async def _flush(self) -> bool:
        # Sends run one at a time (flush_once waits for the last), so nothing adds to these
        # maps while their figures are in the sending thread.
        self.collect()
        if not self._counts and not self._offenders:
            return True
        try:
            await asyncio.to_thread(self._send)
        except SluiceError as exc:
            self.failures += 1
            if self.store_up:
                log.warning("usage store unreachable; keeping figures for later: %s", exc)
            self.store_up = False
            return False
        if not self.store_up:
            log.warning("usage store reachable again")
        self.store_up = True
        self._counts, self._offenders, self._keys = {}, {}, {}
        self._flushes += 1
        if self._flushes % _EXPIRE_EVERY == 0:
            try:
                await asyncio.to_thread(self._store.expire, int(self._clock.now()))
            except SluiceError as exc:
                log.warning("could not expire old usage: %s", exc)
        return True

    def _send(self) -> None:
        """In the sending thread: summarise the per-key counts, then store everything."""
        for rule, second, counts in self._unsummarised:
            summary = summarize(counts, top=self._top_keys)
            kept = self._keys.get((rule, second))
            if kept is None:
                self._keys[(rule, second)] = summary
            else:
                kept.add(summary)
        self._unsummarised = []
        self._store.add(self._counts, self._offenders, self._keys)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()
        # What the last second counted, after any send under way; bounded by timeout_s, so
        # a hung store cannot hold up shutdown (its figures are then lost, and logged).
        if not await self.flush_once():
            log.warning("usage figures not stored before shutdown: the usage store is down")


def _seen(send: asyncio.Future[Any]) -> None:
    """Mark a send's outcome as seen: one nobody waits for any more (the server stopped)
    must not be logged as an exception never retrieved."""
    if not send.cancelled():
        send.exception()
