"""sluice.periodic: the loop behind config polling and usage flushing."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sluice.periodic import Periodic


def test_a_failing_step_is_logged_and_the_next_one_runs(caplog: pytest.LogCaptureFixture) -> None:
    calls = 0
    recovered = asyncio.Event()

    async def step() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("step one broke")
        recovered.set()

    async def main() -> None:
        periodic = Periodic("flush usage", 0.001, step)
        periodic.start()
        try:
            await asyncio.wait_for(recovered.wait(), 10)  # a deadline, not a way to pass a race
        finally:
            await periodic.stop()

    with caplog.at_level(logging.ERROR, logger="sluice.periodic"):
        asyncio.run(main())

    assert calls >= 2
    failures = [r for r in caplog.records if r.name == "sluice.periodic"]
    assert len(failures) == 1
    (record,) = failures
    assert record.levelno == logging.ERROR
    assert record.getMessage() == "flush usage failed"
    assert record.exc_info is not None
    assert isinstance(record.exc_info[1], RuntimeError)
    assert str(record.exc_info[1]) == "step one broke"


def test_stop_ends_the_loop_and_no_step_runs_after_it() -> None:
    calls = 0
    ran = asyncio.Event()

    async def step() -> None:
        nonlocal calls
        calls += 1
        ran.set()

    async def main() -> None:
        periodic = Periodic("poll config", 0.001, step)
        periodic.start()
        await asyncio.wait_for(ran.wait(), 10)
        await periodic.stop()
        stopped_at = calls
        await periodic.stop()  # a second stop is a no-op
        await asyncio.sleep(0.05)  # many intervals: a step still scheduled would have run
        assert calls == stopped_at

    asyncio.run(main())
