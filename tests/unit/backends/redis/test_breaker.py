"""The circuit breaker: open after consecutive failures, one probe after the cool-down."""

from __future__ import annotations

from sluice.backends.redis.breaker import CLOSED, HALF_OPEN, OPEN, CircuitBreaker
from sluice.clock import ManualClock


def test_opens_after_consecutive_failures_and_recovers_through_one_probe() -> None:
    clock = ManualClock()
    breaker = CircuitBreaker(failure_threshold=3, cooldown_s=0.5, clock=clock.now)
    breaker.failure()
    breaker.failure()
    breaker.success()  # only consecutive failures count
    breaker.failure()
    breaker.failure()
    assert breaker.state == CLOSED and not breaker.rejects()
    breaker.failure()
    assert breaker.state == OPEN and breaker.rejects() and not breaker.acquire()
    clock.advance(0.5)
    assert not breaker.rejects()
    assert breaker.acquire() and breaker.state == HALF_OPEN
    assert breaker.rejects() and not breaker.acquire()  # one probe at a time
    breaker.failure()  # a failed probe opens it again at once
    assert breaker.state == OPEN and breaker.rejects()
    clock.advance(0.5)
    assert breaker.acquire()
    breaker.success()
    assert breaker.state == CLOSED and not breaker.rejects() and breaker.opened == 2
