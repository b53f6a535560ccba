"""GCRA (generic cell rate algorithm): a policer with one schedule per key.

``T = P / L``, ``tau = T * b``; ``TAT' = max(TAT, t) + n * T``, admitted iff
``t >= TAT' - tau``. Bursts of exactly ``b`` at once, then one request every ``T``. An
admitted hit proceeds now: ``delay_s`` is always 0.

``TAT`` is kept as ``base + cells * T`` with ``cells`` a whole count, never as a running sum
of ``T``s: see ``_schedule`` for why that makes bursts exact and saturation drift-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.algorithms._schedule import expires, schedule
from sluice.algorithms.base import Algorithm, Limit, Outcome

__all__ = ["ALGORITHM", "GcraState", "expires_at", "step"]


@dataclass(frozen=True, slots=True)
class GcraState:
    """The theoretical arrival time ``TAT = base + cells * T``."""

    base: float  # when the key last restarted (or a TAT as such, with cells = 0)
    cells: int = 0  # cells admitted since


def step(
    state: GcraState | None, limit: Limit, now: float, cost: int
) -> tuple[GcraState | None, Outcome]:
    s = schedule((state.base, state.cells) if state is not None else None, limit, now, cost)
    new = GcraState(*s.cells) if s.cells is not None else state
    return new, Outcome(s.allowed, s.remaining, s.reset_s, fits=s.fits)


def expires_at(state: GcraState, limit: Limit) -> float:
    """The theoretical arrival time, rounded up."""
    return expires((state.base, state.cells), limit)


ALGORITHM: Algorithm = Algorithm("gcra", step, expires_at, takes_burst=True)
