"""The over-limit cache refuses locally only what its backend would refuse anyway."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.algorithms import ALGORITHMS, Limit, Outcome
from sluice.backends import Hit
from sluice.backends.memory import MemoryBackend
from sluice.backends.over_limit_cache import OverLimitCache
from tests.support.algorithm_properties import limits, start_times, time_steps
from tests.support.examples import examples


def run(awaitable):
    return asyncio.run(awaitable)


@st.composite
def traffic(draw: st.DrawFn):
    # A rule's limits differ in algorithm or period, as validation requires (limits that did
    # not would share, and disagree about, one counter).
    one_rule = st.lists(
        st.sampled_from(list(ALGORITHMS)).flatmap(limits),
        min_size=1,
        max_size=2,
        unique_by=lambda limit: (limit.algorithm, limit.period_s),
    )
    rules = [tuple(draw(one_rule)) for _ in range(draw(st.integers(1, 3)))]
    steps = []
    for _ in range(draw(st.integers(1, 40))):
        rule = draw(st.integers(0, len(rules) - 1))
        hits = [Hit(("c", str(rule)), rules[rule], draw(st.integers(0, 4)))]
        steps.append((draw(time_steps), hits))
    return draw(start_times), steps


@settings(max_examples=examples(300), deadline=None)
@given(traffic())
def test_admits_and_refuses_exactly_like_the_backend_alone(example) -> None:
    now, steps = example
    plain = MemoryBackend()
    cached = OverLimitCache(MemoryBackend(), max_keys=2)
    # Per counter and limits: when the backend last decided a hit there, and what it said.
    learnt: dict[tuple, tuple[float, tuple[Outcome, ...]]] = {}

    async def check() -> None:
        t = now
        for step, hits in steps:
            t += step
            expected = plain.apply_now(hits, t)
            local_before = cached.local_refusals
            got = await cached.apply(hits, t)
            [hit] = hits
            if cached.local_refusals == local_before:
                assert got == expected  # decided by the backend: the backend's own outcomes
                learnt[(hit.counter_key, hit.limits)] = (t, expected[0])
                continue
            [answer], [truth] = got, expected
            # Every field of every limit is the backend's last answer on this counter, its
            # waits aged by the time since (nothing else happened to the counter meanwhile).
            at, remembered = learnt[(hit.counter_key, hit.limits)]
            assert [replace(o, reset_s=0.0) for o in answer] == [
                replace(o, reset_s=0.0, local=True) for o in remembered
            ]
            for o, r in zip(answer, remembered, strict=True):
                assert o.reset_s == pytest.approx(max(r.reset_s - (t - at), 0.0), abs=1e-9)
            assert not all(o.allowed for o in answer)  # the cache only ever refuses
            assert not all(e.allowed for e in truth)
            for o, e in zip(answer, truth, strict=True):
                assert o.fits == e.fits
                # Capacity only comes back with time while a counter is refused: what the
                # cache says is left never exceeds what is there before the hit (a limit
                # that admits reports what is left after it), and a limit it says admits does.
                assert 0 <= o.remaining <= e.remaining + (hit.cost if e.allowed else 0)
                assert e.allowed or not o.allowed
            # What a client is told of a refused hit: the refusing limit with the longest
            # wait (limiter._status). A limit that refused with a shorter wait may admit by
            # now, but never decides while the longest wait lasts.
            refused = [k for k, x in enumerate(answer) if not x.allowed]
            i = max(refused, key=lambda k: answer[k].reset_s)
            o, e = answer[i], truth[i]
            assert not e.allowed and (o.fits, o.delay_s) == (e.fits, e.delay_s)
            # The wait is the backend's, aged by the time since: equal but for the rounding
            # of that subtraction; and still the longest.
            assert o.reset_s == pytest.approx(e.reset_s, rel=1e-12, abs=1e-9)
            longest = max(x.reset_s for x in truth if not x.allowed)
            assert o.reset_s == pytest.approx(longest, rel=1e-12, abs=1e-9)

    run(check())


class Counting:
    def __init__(self) -> None:
        self.inner = MemoryBackend()
        self.calls = 0

    async def apply(self, hits, now):
        self.calls += 1
        return self.inner.apply_now(hits, now)

    async def close(self) -> None:
        pass


def test_a_flood_over_the_limit_stays_local_until_the_wait_is_over() -> None:
    inner = Counting()
    cache = OverLimitCache(inner)
    hit = Hit(("d", "k"), (Limit(5, 60, ALGORITHMS["fixed_window"]),), 1)

    async def flood(now: float, n: int) -> int:
        admitted = 0
        for _ in range(n):
            [outcomes] = await cache.apply([hit], now)
            admitted += outcomes[0].allowed
        return admitted

    assert run(flood(0.0, 100)) == 5
    assert inner.calls == 6  # five admitted, one refusal learnt
    assert cache.local_refusals == 94
    # Smaller hits still ask: they might fit where the refused cost did not.
    run(cache.apply([Hit(("d", "k"), (Limit(5, 60, ALGORITHMS["fixed_window"]),), 0)], 1.0))
    assert inner.calls == 7
    # The remembered wait shrinks as time passes, and ends with the window.
    [refused] = run(cache.apply([hit], 30.0))
    assert not refused[0].allowed and refused[0].reset_s == 30.0
    assert run(flood(60.0, 10)) == 5


def test_a_request_mixes_local_and_remote_answers_in_order() -> None:
    inner = Counting()
    cache = OverLimitCache(inner)
    over = Hit(("d", "over"), (Limit(1, 60, ALGORITHMS["fixed_window"]),), 1)
    fresh = Hit(("d", "fresh"), (Limit(3, 60, ALGORITHMS["fixed_window"]),), 1)
    run(cache.apply([over, over], 0.0))
    calls = inner.calls
    first, second, third = run(cache.apply([fresh, over, fresh], 1.0))
    assert inner.calls == calls + 1
    assert (first[0].allowed, second[0].allowed, third[0].allowed) == (True, False, True)
    assert (first[0].remaining, third[0].remaining) == (2, 1)


def test_the_cache_is_bounded() -> None:
    cache = OverLimitCache(MemoryBackend(), max_keys=3)
    for n in range(10):
        hit = Hit(
            ("d", str(n)), (Limit(0, 60, ALGORITHMS["gcra"], 1),), 2
        )  # never fits: not cached
        run(cache.apply([hit, hit], 0.0))
        over = Hit(("d", f"o{n}"), (Limit(1, 60, ALGORITHMS["fixed_window"]),), 1)
        run(cache.apply([over, over], 0.0))
    assert len(cache) == 3
    assert cache.evictions == 7
