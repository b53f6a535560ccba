"""Leaky bucket as a queue (a shaper): up to ``b`` requests wait, leaking at ``L / P``.

State is the time the queue drains (``free_at``). With ``T = P / L``, a hit of cost ``n``
queues behind ``start = max(free_at, t)`` and is admitted iff ``(start - t) + n * T <= b * T``;
then ``free_at' = start + n * T`` and ``delay_s = start - t`` is how long it must wait for its
turn. It admits exactly what GCRA admits; the difference is that the caller delays admitted
hits by ``delay_s`` so they leave evenly spaced.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.algorithms._schedule import schedule
from sluice.algorithms.base import Algorithm, Limit, Outcome

__all__ = ["ALGORITHM", "QueueState", "expires_at", "step"]


@dataclass(frozen=True, slots=True)
class QueueState:
    free_at: float  # when everything queued so far has leaked out


def step(
    state: QueueState | None, limit: Limit, now: float, cost: int
) -> tuple[QueueState, Outcome]:
    s = schedule(state.free_at if state is not None else None, limit, now, cost)
    new = QueueState(s.at) if s.at is not None else state
    return new, Outcome(s.allowed, s.remaining, s.reset_s, s.delay_s, s.fits)


def expires_at(state: QueueState, limit: Limit) -> float:
    return state.free_at


ALGORITHM = Algorithm("leaky_bucket", step, expires_at, takes_burst=True)
