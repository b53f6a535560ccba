"""GCRA (generic cell rate algorithm): a policer with one stored number per key.

``T = P / L``, ``tau = T * b``; ``TAT' = max(TAT, t) + n * T``, admitted iff
``t >= TAT' - tau`` (evaluated as a wait, see ``_schedule``). Bursts of up to ``b`` at once,
then one request every ``T``. An admitted hit proceeds now: ``delay_s`` is always 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.algorithms._schedule import schedule
from sluice.algorithms.base import Algorithm, Limit, Outcome

__all__ = ["ALGORITHM", "GcraState", "expires_at", "step"]


@dataclass(frozen=True, slots=True)
class GcraState:
    tat: float  # theoretical arrival time


def step(state: GcraState | None, limit: Limit, now: float, cost: int) -> tuple[GcraState, Outcome]:
    s = schedule(state.tat if state is not None else None, limit, now, cost)
    new = GcraState(s.at) if s.at is not None else state
    return new, Outcome(s.allowed, s.remaining, s.reset_s, fits=s.fits)


def expires_at(state: GcraState, limit: Limit) -> float:
    return state.tat


ALGORITHM = Algorithm("gcra", step, expires_at, takes_burst=True)
