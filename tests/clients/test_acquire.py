"""acquire() against a real Sluice (gRPC server, limiter, algorithms) whose clock the test
steps, through the client's injected ``clock`` and ``sleep``: every delay and retry-after is
exact and nothing really sleeps, however busy the machine is."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

import pytest

from sluice_client import AsyncClient, Client, RateLimited

if TYPE_CHECKING:
    from sluice.clock import ManualClock
    from tests.clients.conftest import SteppedSluice


class FakeTime:
    """The client's clock and sleep over the server's ManualClock. A wait is recorded and,
    with ``moves_server``, moves the server's clock too; without, the server sees every
    request at the same instant (requests arriving together), while the client's own clock
    still counts the waits against ``max_wait_s``."""

    def __init__(self, server_clock: ManualClock, *, moves_server: bool) -> None:
        self._server = server_clock
        self._moves_server = moves_server
        self.waits: list[float] = []

    def clock(self) -> float:
        return self._server.now() + (0 if self._moves_server else sum(self.waits))

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        if self._moves_server:
            self._server.advance(seconds)

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


def test_acquire_waits_out_the_leaky_bucket_delay(
    stepped_sluice: SteppedSluice, domain: str, unique: str
) -> None:
    # 2 per second, 4 queued at most: requests arriving together leave 0.5 s apart.
    fake = FakeTime(stepped_sluice.clock, moves_server=False)
    with Client(stepped_sluice.grpc_target) as client:
        for _ in range(4):
            decision = client.acquire(
                domain, [{"shaped": unique}], max_wait_s=2, clock=fake.clock, sleep=fake.sleep
            )
            assert decision.allowed
        assert fake.waits == pytest.approx([0.5, 1.0, 1.5])

        # The queue is full: the next one would fit in 0.5 s, beyond max_wait_s.
        with pytest.raises(RateLimited, match="beyond the 0.2s max_wait_s") as caught:
            client.acquire(
                domain, [{"shaped": unique}], max_wait_s=0.2, clock=fake.clock, sleep=fake.sleep
            )
    assert caught.value.decision.retry_after_s == pytest.approx(0.5)
    assert len(fake.waits) == 3  # gave up without waiting


def test_async_acquire_waits_out_the_leaky_bucket_delay(
    stepped_sluice: SteppedSluice, domain: str, unique: str
) -> None:
    fake = FakeTime(stepped_sluice.clock, moves_server=False)

    async def run() -> None:
        async with AsyncClient(stepped_sluice.grpc_target) as client:
            for _ in range(3):
                await client.acquire(
                    domain,
                    [{"shaped": unique}],
                    max_wait_s=2,
                    clock=fake.clock,
                    sleep=fake.async_sleep,
                )

    asyncio.run(run())
    assert fake.waits == pytest.approx([0.5, 1.0])


def test_acquire_rechecks_after_the_retry_after(
    stepped_sluice: SteppedSluice, domain: str, unique: str
) -> None:
    # 5 per second, no queue (burst 1): after one request the next fits 0.2 s later.
    fake = FakeTime(stepped_sluice.clock, moves_server=True)
    with Client(stepped_sluice.grpc_target) as client:
        assert client.check(domain, [{"paced": unique}]).allowed
        decision = client.acquire(
            domain, [{"paced": unique}], max_wait_s=2, clock=fake.clock, sleep=fake.sleep
        )
    assert decision.allowed and decision.delay_s == 0
    # Refused, one wait of the retry-after (which moved the server's clock), then admitted.
    assert fake.waits == pytest.approx([0.2])


def test_async_acquire_gives_up_on_what_never_fits(
    stepped_sluice: SteppedSluice, domain: str
) -> None:
    fake = FakeTime(stepped_sluice.clock, moves_server=True)

    async def run() -> None:
        async with AsyncClient(stepped_sluice.grpc_target) as client:
            await client.acquire(
                domain, [{"blocked": "x"}], max_wait_s=10, clock=fake.clock, sleep=fake.async_sleep
            )

    with pytest.raises(RateLimited, match="nothing is ever admitted"):
        asyncio.run(run())
    assert fake.waits == []  # gave up at once, without waiting any of its 10 s


def test_acquire_under_an_outage_follows_on_unavailable(
    unreachable_target: str, domain: str
) -> None:
    with Client(unreachable_target, on_unavailable="allow") as client:
        assert client.acquire(domain, [{"user": "u"}], max_wait_s=1).degraded
    with Client(unreachable_target, on_unavailable="deny") as client:
        with pytest.raises(RateLimited, match="Sluice unavailable"):
            client.acquire(domain, [{"user": "u"}], max_wait_s=1)
