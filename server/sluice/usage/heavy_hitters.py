"""A bounded heavy-hitters sketch (Space-Saving, Metwally et al. 2005).

Keeps at most ``capacity`` keys; a new key evicts the one with the smallest count and
inherits that count as its error bound. Any key whose true count exceeds total/capacity is
guaranteed to be present, and no count is ever under-reported.
"""

from __future__ import annotations

__all__ = ["SpaceSaving"]


class SpaceSaving:
    __slots__ = ("capacity", "_counts")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self._counts: dict[str, int] = {}

    def add(self, key: str, count: int = 1) -> None:
        counts = self._counts
        if key in counts:
            counts[key] += count
        elif len(counts) < self.capacity:
            counts[key] = count
        else:
            # O(capacity) per eviction; capacities here are tens of keys, and only
            # over-limit hits of new keys reach this line.
            smallest = min(counts, key=counts.__getitem__)
            counts[key] = counts.pop(smallest) + count

    def top(self, n: int | None = None) -> list[tuple[str, int]]:
        ranked = sorted(self._counts.items(), key=lambda item: (-item[1], item[0]))
        return ranked if n is None else ranked[:n]

    def __len__(self) -> int:
        return len(self._counts)
