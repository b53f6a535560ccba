"""Sampled access logging of decisions (sluice/access_log.py) through the core both
transports answer with (sluice/grpc/core.py), over a real limiter and memory backend."""

from __future__ import annotations

import asyncio
import logging

import pytest

from sluice.access_log import AccessLog
from sluice.backends.memory import MemoryBackend
from sluice.clock import ManualClock
from sluice.edge.status import GrpcError
from sluice.grpc.core import RateLimitCore
from sluice.limiter import RateLimiter
from sluice.model import Descriptor, RateLimitRequest
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text

POLICY = (
    "domain: d\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 1}\n"
)


class Peer:
    """What grpc.aio's call context offers the access log."""

    def peer(self) -> str:
        return "ipv4:10.0.0.7:51234"


def _core(access_log: AccessLog | None) -> RateLimitCore:
    snapshot = Snapshot(load_text(POLICY))
    limiter = RateLimiter(lambda: snapshot, MemoryBackend(), ManualClock(1_700_000_000.0))
    return RateLimitCore(limiter, access_log=access_log)


def _request(domain: str = "d") -> RateLimitRequest:
    return RateLimitRequest(domain, (Descriptor((("user", "ada"),)),))


def test_a_sampled_share_of_calls_is_logged_with_its_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    draws = iter([0.05, 0.5, 0.05, 0.05])  # rate 0.1: the first, third and fourth calls
    with caplog.at_level(logging.DEBUG, "sluice.access"):
        access_log = AccessLog.create(0.1, rand=lambda: next(draws))
        assert access_log is not None
        core = _core(access_log)

        async def calls() -> None:
            for _ in range(3):
                await core.decide(_request(), Peer())
            with pytest.raises(GrpcError):
                await core.decide(_request(""))

        asyncio.run(calls())
    records = [r for r in caplog.records if r.name == "sluice.access"]
    assert access_log.logged == 3 and len(records) == 3
    assert all(r.levelno == logging.DEBUG for r in records)
    first, third, invalid = records
    assert first.getMessage().startswith(
        "decision domain=d descriptors=[user=ada] overall_code=OK duration_ms="
    )
    assert first.getMessage().endswith(" peer=ipv4:10.0.0.7:51234")
    assert (first.domain, first.overall_code, first.peer) == ("d", "OK", "ipv4:10.0.0.7:51234")  # type: ignore[attr-defined]
    assert third.overall_code == "OVER_LIMIT"  # type: ignore[attr-defined]
    assert (invalid.overall_code, invalid.peer) == ("invalid", "-")  # type: ignore[attr-defined]
    assert isinstance(first.duration_ms, float) and first.duration_ms >= 0  # type: ignore[attr-defined]


@pytest.mark.parametrize(("rate", "level"), [(0.0, logging.DEBUG), (1.0, logging.INFO)])
def test_off_unless_sampling_at_debug(
    caplog: pytest.LogCaptureFixture, rate: float, level: int
) -> None:
    with caplog.at_level(level, "sluice.access"):
        assert AccessLog.create(rate) is None
