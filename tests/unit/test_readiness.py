"""Readiness (sluice/readiness.py): each reason it gives, and ready when none applies."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from sluice.algorithms import Outcome
from sluice.backends import Hit
from sluice.backends.memory import MemoryBackend
from sluice.clock import ManualClock
from sluice.errors import BackendUnavailableError
from sluice.model import RateLimit, Unit
from sluice.policies.reloader import ReloadStatus
from sluice.policies.snapshot import compile_limit
from sluice.readiness import PROBE_KEY, Readiness


class DownBackend(MemoryBackend):
    async def apply(self, hits: Sequence[Hit], now: float) -> list[tuple[Outcome, ...]]:
        raise BackendUnavailableError("redis: connection refused")


def reason(*, serving: bool = True, source: str | None = "database", backend=None) -> str | None:
    status = None if source is None else ReloadStatus(source=source)
    readiness = Readiness(
        serving=lambda: serving,
        config=lambda: status,
        backend=backend if backend is not None else MemoryBackend(),
        clock=ManualClock(1000.0),
    )
    return asyncio.run(readiness.reason())


def test_ready_with_a_loaded_version_and_a_backend_that_answers() -> None:
    assert reason() is None
    assert reason(source="cache") is None  # started from the local copy: it serves


def test_not_ready_while_not_serving() -> None:
    assert reason(serving=False) == "not serving (starting or draining)"


def test_not_ready_before_any_policy_version_is_loaded() -> None:
    assert reason(source=None) == "no policy version loaded yet"
    assert reason(source="none") == "no policy version loaded yet"


def test_not_ready_when_the_backend_does_not_answer() -> None:
    assert reason(backend=DownBackend()) == "state backend unavailable: redis: connection refused"


def test_the_probe_counts_nothing() -> None:
    backend = MemoryBackend()
    for _ in range(3):
        assert reason(backend=backend) is None
    # A cost-0 hit on a limit of one: three probes later it still admits a real hit.
    [outcomes] = asyncio.run(backend.apply([_hit_of_one()], 1000.0))
    assert outcomes[0].allowed


def _hit_of_one() -> Hit:
    return Hit(PROBE_KEY, (compile_limit(RateLimit(1, Unit.SECOND)),), 1)
