"""Where algorithm state lives. The seam is batch-shaped: one call per request, all hits in it,
so a remote backend can answer in one round trip."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from sluice.algorithms import Outcome

__all__ = ["Backend", "Hit"]


@dataclass(frozen=True, slots=True)
class Hit:
    """``cost`` hits on the counter ``counter_key``, limited to ``limit`` per ``window_s``."""

    counter_key: tuple[str, ...]
    limit: int
    window_s: int
    cost: int


class Backend(Protocol):
    async def apply(self, hits: Sequence[Hit], now: float) -> list[Outcome]:
        """Apply every hit of one request, in order, and return one outcome per hit."""
        ...

    async def close(self) -> None: ...
