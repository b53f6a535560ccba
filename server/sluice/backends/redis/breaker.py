"""A circuit breaker, so a dead Redis costs microseconds per request instead of a timeout.

closed: calls go through; ``failure_threshold`` consecutive failures open it.
open: calls fail at once, without touching the network, for ``cooldown_s``.
half-open: after the cool-down, the next call is let through as a probe while the others
keep failing fast; its success closes the breaker, its failure opens it for another
cool-down. Real calls are the probes, so recovery needs no background task.

On Redis Cluster the backend keeps one breaker per master (``sibling``): a dead master fails
its own slots fast while the others keep deciding.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half-open"


class CircuitBreaker:
    def __init__(
        self,
        *,
        failure_threshold: int = 3,
        cooldown_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if failure_threshold < 1:
            raise ValueError("failure_threshold must be at least 1")
        self.failure_threshold = failure_threshold
        self.cooldown_s = cooldown_s
        self._clock = clock
        self.state = CLOSED
        self.failures = 0  # consecutive
        self.opened = 0  # how many times it opened, for metrics and tests
        self._opened_at = 0.0

    def sibling(self) -> CircuitBreaker:
        """A new, closed breaker with the same threshold, cool-down and clock."""
        return CircuitBreaker(
            failure_threshold=self.failure_threshold, cooldown_s=self.cooldown_s, clock=self._clock
        )

    def rejects(self) -> bool:
        """True while calls must fail fast (open and cooling down, or a probe in flight)."""
        if self.state == CLOSED:
            return False
        if self.state == OPEN:
            return self._clock() < self._opened_at + self.cooldown_s
        return True

    def acquire(self) -> bool:
        """May a call go to the network now? Claims the probe when the cool-down is over."""
        if self.state == CLOSED:
            return True
        if self.state == OPEN and self._clock() >= self._opened_at + self.cooldown_s:
            self.state = HALF_OPEN
            return True
        return False

    def success(self) -> None:
        self.state = CLOSED
        self.failures = 0

    def failure(self) -> None:
        self.failures += 1
        if self.state == HALF_OPEN or self.failures >= self.failure_threshold:
            if self.state != OPEN:
                self.opened += 1
            self.state = OPEN
            self._opened_at = self._clock()
