"""Background work repeated on an interval: config polling, usage flushing."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

__all__ = ["Periodic"]

log = logging.getLogger(__name__)


class Periodic:
    """Runs ``step`` every ``interval_s`` seconds until stopped; a failing step is logged and
    the next one still runs, so one bug cannot stop the work for good."""

    def __init__(self, name: str, interval_s: float, step: Callable[[], Awaitable[object]]) -> None:
        self._name = name
        self._interval_s = interval_s
        self._step = step
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    def start(self) -> None:
        self._stopping = False
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            # The flag as well as the cancel: on Python 3.11 asyncio.wait_for returns its
            # result instead of raising when the cancel arrives just as the awaited future
            # completes (fixed in 3.12), and a step awaiting one (the config poll does) would
            # then loop on forever and hold up the shutdown.
            self._stopping = True
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._interval_s)
            try:
                await self._step()
            except Exception:
                log.exception("%s failed", self._name)
