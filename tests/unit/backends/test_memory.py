"""The memory backend: exact counts, expiry of ended windows, and its key cap."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from sluice.algorithms import ALGORITHMS, Limit, Outcome
from sluice.backends import Hit
from sluice.backends.memory import MemoryBackend, synchronous_apply


def apply(backend: MemoryBackend, hits: list[Hit], now: float) -> list[tuple[bool, int]]:
    return [(o.allowed, o.remaining) for (o,) in asyncio.run(backend.apply(hits, now))]


def hit(key: tuple[str, ...], limit: int, window_s: int, cost: int) -> Hit:
    return Hit(key, (Limit(limit, window_s, ALGORITHMS["fixed_window"]),), cost)


def test_hits_of_one_request_apply_in_order_to_shared_counters() -> None:
    backend = MemoryBackend()
    one = hit(("d", "k", "v"), 2, 60, 1)
    assert apply(backend, [one, one, one], 0.0) == [(True, 1), (True, 0), (False, 0)]


def test_ended_windows_are_evicted() -> None:
    backend = MemoryBackend()
    apply(backend, [hit(("a",), 5, 1, 1), hit(("b",), 5, 60, 1)], 100.0)
    assert len(backend) == 2
    apply(backend, [], 101.0)  # the 1 s window of "a" ended at 101
    assert len(backend) == 1
    apply(backend, [], 120.0)  # "b"'s window [60, 120) ended too
    assert len(backend) == 0


def test_a_renewed_key_is_not_evicted_by_its_old_expiry() -> None:
    backend = MemoryBackend()
    one = hit(("a",), 5, 1, 1)
    apply(backend, [one], 100.0)
    apply(backend, [one], 101.0)  # new window [101, 102); the old expiry bucket is due now
    assert len(backend) == 1
    assert apply(backend, [one], 101.5) == [(True, 3)]


def test_the_key_cap_evicts_the_least_recently_used() -> None:
    backend = MemoryBackend(max_keys=2)
    a, b, c = (hit((name,), 10, 3600, 1) for name in "abc")
    apply(backend, [a, b, a, c], 0.0)  # b is least recently used when c arrives
    assert len(backend) == 2 and backend.evictions == 1
    assert apply(backend, [a, b], 1.0) == [(True, 7), (True, 9)]


def test_bookkeeping_stays_bounded_under_key_churn() -> None:
    backend = MemoryBackend(max_keys=10)
    for i in range(5000):
        apply(backend, [hit((str(i),), 10, 86400, 1)], 0.0)
    assert len(backend) == 10
    assert backend._due_size <= 2 * 10 + 1024  # noqa: SLF001 (the bound is the point)


def test_max_keys_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_keys must be at least 1"):
        MemoryBackend(max_keys=0)


def test_fixed_windows_count_a_hit_another_limit_refused() -> None:
    backend = MemoryBackend()
    per_minute, per_second = (
        Limit(10, 60, ALGORITHMS["fixed_window"]),
        Limit(1, 1, ALGORITHMS["fixed_window"]),
    )
    both = Hit(("k",), (per_minute, per_second), 1)
    [(m1, s1)] = asyncio.run(backend.apply([both], 0.0))
    [(m2, s2)] = asyncio.run(backend.apply([both], 0.5))
    assert (m1.allowed, s1.allowed, m2.allowed, s2.allowed) == (True, True, True, False)
    # Refused, yet counted: fixed windows count every hit, as envoyproxy/ratelimit does.
    check = Hit(("k",), (per_minute,), 0)
    assert asyncio.run(backend.apply([check], 0.9))[0][0].remaining == 8


def test_a_full_backend_never_evicts_a_key_of_the_hit_it_is_applying() -> None:
    # Found by tests/abuse/test_request_fuzz.py: storing the fixed window of a refused hit
    # evicted the least recently used key, the hit's own sliding log, which it then touched:
    # KeyError, an INTERNAL error for the caller.
    backend = MemoryBackend(max_keys=2)
    limits = (
        Limit(1, 60, ALGORITHMS["fixed_window"]),
        Limit(5, 3600, ALGORITHMS["sliding_window_log"], 5),
    )
    x = Hit(("x",), limits, 1)
    asyncio.run(backend.apply([x], 0.0))  # x's two keys: the backend is full
    asyncio.run(backend.apply([hit(("y",), 5, 60, 1)], 1.0))  # y evicts x's fixed window
    [(window, log)] = asyncio.run(backend.apply([Hit(("x",), limits, 2)], 2.0))
    assert (window.allowed, log.allowed) == (False, True)  # refused: the window's limit is 1
    assert len(backend) == 2


def test_the_limiter_may_skip_the_coroutine_only_where_apply_does_nothing_else() -> None:
    class Gated(MemoryBackend):
        async def apply(self, hits: Sequence[Hit], now: float) -> list[tuple[Outcome, ...]]:
            return []  # a test double holding calls, say: it must be awaited

    assert synchronous_apply(MemoryBackend()) is not None
    assert synchronous_apply(Gated()) is None
