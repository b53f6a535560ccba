"""Where algorithm state lives. The seam is batch-shaped: one call per request (or per batch
of requests), all hits in it, so a remote backend can answer in one round trip."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from sluice.algorithms import Limit, Outcome
from sluice.records import record

__all__ = ["Backend", "Hit"]


@record
class Hit:
    """``cost`` hits on the counter ``counter_key``, which every limit in ``limits`` bounds.

    The hit is admitted only if every limit admits it; when one refuses, no limit's state
    changes, except fixed windows, which count every hit.
    """

    counter_key: tuple[str, ...]
    limits: tuple[Limit, ...]
    cost: int


class Backend(Protocol):
    async def apply(self, hits: Sequence[Hit], now: float) -> list[tuple[Outcome, ...]]:
        """Apply every hit, in order; one outcome per limit of each hit.

        Raises BackendUnavailableError when the state cannot be reached.
        """
        ...

    def metric_values(self) -> dict[str, float]:
        """Counters and gauges for ``/metrics`` (names as in ``sluice.metrics``), read when
        scraped."""
        ...

    async def close(self) -> None: ...
