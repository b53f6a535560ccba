"""Wildcard values (``*`` matches any run of characters, also none) matched in linear time.

A rule value such as ``*a*a*a*b`` compiled to a backtracking regular expression took seconds to
minutes against one 1 KiB request value, on the event loop, so one request froze the server.
Here the pieces between the stars are found left to right with ``str.find``: for a pattern
made of stars alone, the leftmost occurrence of each piece is always as good as any later
one, so nothing is ever retried. The cost is O(len(value) · len(pattern)) at worst, and far
less in practice since ``str.find`` runs in C.
"""

from __future__ import annotations

__all__ = ["MAX_WILDCARDS", "Glob"]

# Validation refuses values with more stars than this: the matcher is linear whatever the
# count, but a bound keeps the per-value cost a small, stated multiple of the value's length.
MAX_WILDCARDS = 16


class Glob:
    """A compiled wildcard value; ``matches`` is true when the whole value fits the pattern."""

    __slots__ = ("pattern", "_prefix", "_middle", "_suffix", "_fixed_length")

    def __init__(self, pattern: str) -> None:
        if "*" not in pattern:
            raise ValueError(f"not a wildcard pattern: {pattern!r}")
        self.pattern = pattern
        pieces = pattern.split("*")
        self._prefix = pieces[0]
        self._suffix = pieces[-1]
        self._middle = tuple(piece for piece in pieces[1:-1] if piece)
        self._fixed_length = len(self._prefix) + len(self._suffix)

    def matches(self, value: str) -> bool:
        if len(value) < self._fixed_length:
            return False
        if not (value.startswith(self._prefix) and value.endswith(self._suffix)):
            return False
        position, end = len(self._prefix), len(value) - len(self._suffix)
        for piece in self._middle:
            found = value.find(piece, position, end)
            if found < 0:
                return False
            position = found + len(piece)
        return True

    def __repr__(self) -> str:
        return f"Glob({self.pattern!r})"
