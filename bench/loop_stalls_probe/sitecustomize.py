"""The stall probe of bench/loop_stalls.py, loaded by Python's ``site`` at start-up when this
directory is on PYTHONPATH; active only in the interpreter Envoy embeds (the launcher sets
``SLUICE_EDGE_CONTROL_FD`` there) and when ``SLUICE_STALL_PROBE`` names an output file.

It appends one line of JSON per event to that file (every 2 s, from the loop):
- ``lag``: a 1 ms timer woke more than 2 ms late; with the loop thread's CPU time in that
  interval, so a stall of the loop's own work (CPU ≈ lag) is told from waiting (for the
  GIL, or for the core, which other processes share);
- ``gc``: a cyclic collection over 0.3 ms: generation, wall and loop-thread CPU time;
- ``thread``: an ``asyncio.to_thread`` job (config poll, usage flush): its name, CPU time
  (held with the GIL, in part) and wall time.
Times are epoch milliseconds, comparable with h2load's request log.
"""

from __future__ import annotations

import os

if os.environ.get("SLUICE_EDGE_CONTROL_FD") and os.environ.get("SLUICE_STALL_PROBE"):
    import asyncio
    import gc
    import json
    import time

    _out = os.environ["SLUICE_STALL_PROBE"]
    _events: list[list[object]] = []
    _gc_started = [0.0, 0.0]

    def _now_ms() -> float:
        return time.time() * 1000

    def _on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            _gc_started[:] = [time.perf_counter(), time.thread_time()]
            return
        wall = (time.perf_counter() - _gc_started[0]) * 1000
        if wall > 0.3:
            cpu = (time.thread_time() - _gc_started[1]) * 1000
            _events.append([_now_ms(), "gc", info["generation"], round(wall, 2), round(cpu, 2)])

    _to_thread = asyncio.to_thread

    async def _timed_to_thread(func, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        def run():  # type: ignore[no-untyped-def]
            cpu, wall = time.thread_time(), time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                _events.append(
                    [
                        _now_ms(),
                        "thread",
                        getattr(func, "__qualname__", repr(func)),
                        round((time.thread_time() - cpu) * 1000, 2),
                        round((time.perf_counter() - wall) * 1000, 2),
                    ]
                )

        return await _to_thread(run)

    async def _watch_lag() -> None:
        while True:
            wall, cpu = time.perf_counter(), time.thread_time()
            await asyncio.sleep(0.001)
            late = (time.perf_counter() - wall - 0.001) * 1000
            if late > 2:
                busy = (time.thread_time() - cpu) * 1000
                _events.append([_now_ms(), "lag", round(late, 2), round(busy, 2)])

    async def _write() -> None:
        while True:
            await asyncio.sleep(2)
            if _events:
                with open(_out, "a") as out:
                    out.writelines(json.dumps(e) + "\n" for e in _events)
                _events.clear()

    def _install() -> None:
        from sluice.app import Sluice

        start = Sluice.start

        async def start_watched(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            await start(self, *args, **kwargs)
            loop = asyncio.get_running_loop()
            loop.create_task(_watch_lag())
            loop.create_task(_write())

        Sluice.start = start_watched  # type: ignore[method-assign]

    gc.callbacks.append(_on_gc)
    asyncio.to_thread = _timed_to_thread
    _install()
