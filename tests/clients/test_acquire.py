"""acquire() against a live server, waiting through an injected sleep (recorded, and only
really slept where a re-check needs real time to pass, at most one second)."""

from __future__ import annotations

import asyncio
import time

import pytest

from sluice_client import AsyncClient, Client, RateLimited
from tests.support.processes import SluiceProcess


class FakeTime:
    """A clock that moves by what ``sleep`` was asked to wait (plus real time)."""

    def __init__(self) -> None:
        self.waits: list[float] = []

    def clock(self) -> float:
        return time.monotonic() + sum(self.waits)

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)

    async def async_sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


def test_acquire_waits_out_the_leaky_bucket_delay(
    sluice: SluiceProcess, domain: str, unique: str
) -> None:
    # 2 per second, 4 queued at most: admitted requests leave 0.5 s apart.
    fake = FakeTime()
    with Client(sluice.grpc_target) as client:
        for _ in range(4):
            decision = client.acquire(
                domain, [{"shaped": unique}], max_wait_s=2, clock=fake.clock, sleep=fake.sleep
            )
            assert decision.allowed
        assert fake.waits == pytest.approx([0.5, 1.0, 1.5], abs=0.15)

        # The queue is full: the next one would fit in ~0.5 s, beyond max_wait_s.
        with pytest.raises(RateLimited, match="beyond the 0.2s max_wait_s") as caught:
            client.acquire(
                domain, [{"shaped": unique}], max_wait_s=0.2, clock=fake.clock, sleep=fake.sleep
            )
    assert caught.value.decision.retry_after_s == pytest.approx(0.5, abs=0.1)
    assert len(fake.waits) == 3  # gave up without waiting


def test_async_acquire_waits_out_the_leaky_bucket_delay(
    sluice: SluiceProcess, domain: str, unique: str
) -> None:
    fake = FakeTime()

    async def run() -> None:
        async with AsyncClient(sluice.grpc_target) as client:
            for _ in range(3):
                await client.acquire(
                    domain,
                    [{"shaped": unique}],
                    max_wait_s=2,
                    clock=fake.clock,
                    sleep=fake.async_sleep,
                )

    asyncio.run(run())
    assert fake.waits == pytest.approx([0.5, 1.0], abs=0.1)


def test_acquire_rechecks_after_the_retry_after(
    sluice: SluiceProcess, domain: str, unique: str
) -> None:
    # 5 per second, no queue (burst 1): after one request the next fits 0.2 s later.
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)  # a bounded real wait (0.2 s): the re-check needs time to pass

    with Client(sluice.grpc_target) as client:
        assert client.check(domain, [{"paced": unique}]).allowed
        decision = client.acquire(domain, [{"paced": unique}], max_wait_s=2, sleep=sleep)
    assert decision.allowed and decision.delay_s == 0
    # One retry-after wait, then admitted at once; only a stall over 0.2 s could skip the wait.
    assert len(waits) == 1 and 0 < waits[0] <= 0.2


def test_async_acquire_gives_up_on_what_never_fits(sluice: SluiceProcess, domain: str) -> None:
    async def run() -> None:
        async with AsyncClient(sluice.grpc_target) as client:
            await client.acquire(domain, [{"blocked": "x"}], max_wait_s=10)

    started = time.monotonic()
    with pytest.raises(RateLimited, match="nothing is ever admitted"):
        asyncio.run(run())
    assert time.monotonic() - started < 1


def test_acquire_under_an_outage_follows_on_unavailable(
    unreachable_target: str, domain: str
) -> None:
    with Client(unreachable_target, on_unavailable="allow") as client:
        assert client.acquire(domain, [{"user": "u"}], max_wait_s=1).degraded
    with Client(unreachable_target, on_unavailable="deny") as client:
        with pytest.raises(RateLimited, match="Sluice unavailable"):
            client.acquire(domain, [{"user": "u"}], max_wait_s=1)
