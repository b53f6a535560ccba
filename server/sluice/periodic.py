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

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=self._name)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self._step()
            except Exception:
                log.exception("%s failed", self._name)
