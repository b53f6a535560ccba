"""Combinators for descriptor sources: functions from a request (an ASGI scope, a gRPC call's
details, anything) to the descriptors to check, [] when none apply.

Entries that cannot be produced drop their whole descriptor, as Envoy's rate-limit actions do:
a descriptor missing an entry would match a different, broader rule.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

__all__ = ["Source", "constant", "each", "nested"]

T = TypeVar("T")
# A source returns descriptors; each is a dict whose items are its entries, in order.
Source = Callable[[T], list[dict[str, str]]]


def constant(key: str, value: str) -> Source[object]:
    """One fixed entry (Envoy's ``generic_key``): ``{key: value}``."""
    return lambda _request: [{key: value}]


def each(*sources: Source[T]) -> Source[T]:
    """Every descriptor of every source, each checked against its own rule."""

    def build(request: T) -> list[dict[str, str]]:
        return [d for source in sources for d in source(request)]

    return build


def nested(*sources: Source[T]) -> Source[T]:
    """One descriptor made of the entries of each source's first descriptor, in order (for
    nested rules such as ``remote_address`` → ``path``); none when any source has none."""

    def build(request: T) -> list[dict[str, str]]:
        merged: dict[str, str] = {}
        for source in sources:
            produced = source(request)
            if not produced:
                return []
            merged.update(produced[0])
        return [merged]

    return build
