"""Leaky bucket as a queue (a shaper): up to ``b`` requests wait, leaking at ``L / P``.

With ``T = P / L``, the queue drains at ``free_at``; a hit of cost ``n`` queues behind
``start = max(free_at, t)`` and is admitted iff ``(start - t) + n * T <= b * T``; then
``free_at' = start + n * T`` and ``delay_s = start - t`` is how long it must wait for its
turn. It admits exactly what GCRA admits; the difference is that the caller delays admitted
hits by ``delay_s`` so they leave evenly spaced.

``free_at`` is kept as ``base + cells * T`` with ``cells`` a whole count, never as a running
sum of ``T``s: see ``_schedule`` for why that makes bursts exact and saturation drift-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.algorithms._schedule import expires, schedule
from sluice.algorithms.base import Algorithm, Limit, Outcome

__all__ = ["ALGORITHM", "QueueState", "expires_at", "step"]


@dataclass(frozen=True, slots=True)
class QueueState:
    """The queue drains at ``free_at = base + cells * T``."""

    base: float  # when the queue last started from empty (or a free_at as such, cells = 0)
    cells: int = 0  # cells queued since


def step(
    state: QueueState | None, limit: Limit, now: float, cost: int
) -> tuple[QueueState | None, Outcome]:
    s = schedule((state.base, state.cells) if state is not None else None, limit, now, cost)
    new = QueueState(*s.cells) if s.cells is not None else state
    return new, Outcome(s.allowed, s.remaining, s.reset_s, s.delay_s, s.fits)


def expires_at(state: QueueState, limit: Limit) -> float:
    """When the queue drains, rounded up."""
    return expires((state.base, state.cells), limit)


ALGORITHM: Algorithm = Algorithm("leaky_bucket", step, expires_at, takes_burst=True)
