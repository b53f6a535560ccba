"""The Redis script decides exactly like the memory backend (the pure step functions).

Differential and property-based: random traffic over random limits (several per hit,
mixing algorithms) goes through ``MemoryBackend.apply_now`` and through the Lua script with
the same explicit ``now``; every outcome field must match bit for bit, and every key the
script wrote must carry a TTL.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.asyncio as aredis
from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.algorithms import ALGORITHMS, Limit, Outcome, gcra, leaky_bucket
from sluice.algorithms._schedule import FOLD_CELLS
from sluice.algorithms.calendar import CALENDAR_UNITS, calendar_for
from sluice.backends import Hit
from sluice.backends.memory import MemoryBackend
from sluice.backends.redis.scripts import SCRIPT_SOURCE, ApplyScript, decode_result, encode_args
from sluice.model import Unit
from tests.support.algorithm_properties import (
    check_saturated_rate,
    schedule_limits,
    schedule_times,
    start_times,
    time_steps,
)
from tests.support.examples import examples

# name -> (module, state type) of the algorithms that keep a schedule (base, cells).
SCHEDULES = {
    "gcra": (gcra, gcra.GcraState),
    "leaky_bucket": (leaky_bucket, leaky_bucket.QueueState),
}
# The script of instances from before gcra and leaky_bucket counted cells (its gcra and
# leaky_bucket only), to play an old instance in a rolling upgrade.
OLD_SCRIPT_SOURCE = (Path(__file__).parent / "lua" / "apply_before_cells.lua").read_text()
# The script of instances from before the lean driver and fixed window (whose fixed windows
# set the expiry on every hit), to play an old instance in a rolling upgrade.
OLD_FIXED_WINDOW_SOURCE = (Path(__file__).parent / "lua" / "apply_before_lean.lua").read_text()


class Harness:
    """A private event loop and client, so synchronous hypothesis tests can await."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.client = aredis.Redis.from_url(url)
        self.script = ApplyScript(self.client)

    def run(self, awaitable):
        return self.loop.run_until_complete(awaitable)

    def close(self) -> None:
        self.run(self.client.aclose())
        self.loop.close()


@pytest.fixture(scope="module")
def harness(redis_server: str) -> Iterator[Harness]:
    harness = Harness(redis_server)
    yield harness
    harness.close()


@st.composite
def limit_sets(draw: st.DrawFn, algorithms: tuple[str, ...]) -> tuple[Limit, ...]:
    """1-3 limits of one counter.

    Distinct (algorithm, period) pairs: the memory backend names state by them, so two limits
    differing only in rate would share (and disagree about) one state.
    """
    kinds = st.tuples(st.sampled_from(algorithms), st.sampled_from([1, 2, 3, 60]))
    limits = []
    for algorithm, period in draw(st.lists(kinds, min_size=1, max_size=3, unique=True)):
        rate = draw(st.one_of(st.integers(0, 6), st.just(50)))
        limits.append(Limit(rate, period, ALGORITHMS[algorithm], draw(st.integers(0, 6))))
    return tuple(limits)


@st.composite
def traffic(draw: st.DrawFn, algorithms: tuple[str, ...] = tuple(ALGORITHMS)):
    rules = draw(st.lists(limit_sets(algorithms), min_size=1, max_size=3))
    steps = []
    for _ in range(draw(st.integers(1, 20))):
        batch = []
        for _ in range(draw(st.integers(1, 3))):
            rule = draw(st.integers(0, len(rules) - 1))
            batch.append(Hit((f"c{rule}",), rules[rule], draw(st.integers(0, 7))))
        steps.append((draw(time_steps), batch))
    return draw(start_times), steps


def _keys(prefix: str, hits: list[Hit]) -> list[str]:
    # The hash tag keeps an example's keys in one slot, as Redis Cluster would need.
    return [
        f"{{{prefix}}}:{hit.counter_key[0]}:{limit.algorithm.name}:{limit.period_s}"
        for hit in hits
        for limit in hit.limits
    ]


def _exact(outcomes: list[tuple[Outcome, ...]]) -> list[tuple[tuple, ...]]:
    return [
        tuple(
            (o.allowed, o.remaining, float(o.reset_s).hex(), float(o.delay_s).hex(), o.fits)
            for o in per_hit
        )
        for per_hit in outcomes
    ]


def _replay(harness: Harness, t0: float, steps: list[tuple[float, list[Hit]]]) -> None:
    prefix = uuid.uuid4().hex
    memory = MemoryBackend()
    t = t0
    try:
        for dt, hits in steps:
            t += dt
            keys = _keys(prefix, hits)
            expected = memory.apply_now(hits, t)
            got = harness.run(harness.script(keys, hits, t))
            assert _exact(got) == _exact(expected), (t, hits)
            written = harness.run(harness.client.keys(f"{{{prefix}}}:*"))
            for key in written:
                assert harness.run(harness.client.pttl(key)) > 0, key
    finally:
        written = harness.run(harness.client.keys(f"{{{prefix}}}:*"))
        if written:
            harness.run(harness.client.delete(*written))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@settings(max_examples=examples(60), deadline=None)
@given(data=st.data())
def test_one_algorithm_matches_memory(harness: Harness, algorithm: str, data) -> None:
    _replay(harness, *data.draw(traffic((algorithm,))))


@pytest.mark.slow
@settings(max_examples=examples(200), deadline=None)
@given(case=traffic())
def test_mixed_limits_match_memory(harness: Harness, case) -> None:
    _replay(harness, *case)


def test_worked_examples_through_redis(harness: Harness) -> None:
    gcra = Hit(("g",), (Limit(3, 60, ALGORITHMS["gcra"], 3),), 1)
    leaky = Hit(("l",), (Limit(1, 1, ALGORITHMS["leaky_bucket"], 3),), 1)
    keys = [f"{{w}}:{uuid.uuid4().hex}", f"{{w}}:{uuid.uuid4().hex}"]
    for _ in range(3):
        harness.run(harness.script(keys, [gcra, leaky], 0.0))
    (g,), (lk,) = harness.run(harness.script(keys, [gcra, leaky], 0.0))
    assert g == Outcome(False, 0, 20.0)
    assert lk == Outcome(False, 0, 1.0)
    (g,), (lk,) = harness.run(harness.script(keys, [gcra, leaky], 1.0))
    assert lk == Outcome(True, 0, 3.0, delay_s=2.0)


def test_a_refused_hit_writes_nothing(harness: Harness) -> None:
    key = f"{{r}}:{uuid.uuid4().hex}"
    free = f"{{r}}:{uuid.uuid4().hex}"
    hit = Hit(
        ("r",),
        (Limit(1, 60, ALGORITHMS["token_bucket"], 1), Limit(9, 60, ALGORITHMS["gcra"], 9)),
        1,
    )
    harness.run(harness.script([key, free], [hit], 100.0))
    # A key without TTL (say, set by hand) must keep having none after a refused hit.
    harness.run(harness.client.persist(key))
    before = harness.run(harness.client.dump(key)), harness.run(harness.client.get(free))
    ((bucket, gcra),) = harness.run(harness.script([key, free], [hit], 101.0))
    assert not bucket.allowed and gcra.allowed
    assert harness.run(harness.client.pttl(key)) == -1
    after = harness.run(harness.client.dump(key)), harness.run(harness.client.get(free))
    assert after == before


def test_fixed_windows_count_refused_hits_and_other_limits_do_not(harness: Harness) -> None:
    fixed, log = f"{{f}}:{uuid.uuid4().hex}", f"{{f}}:{uuid.uuid4().hex}"
    hit = Hit(
        ("f",),
        (Limit(5, 60, ALGORITHMS["fixed_window"]), Limit(1, 60, ALGORITHMS["sliding_window_log"])),
        1,
    )
    for expected in (True, False, False):
        ((_, outcome),) = harness.run(harness.script([fixed, log], [hit], 30.0))
        assert outcome.allowed is expected
    assert harness.run(harness.client.hget(fixed, "c")) == b"3"
    assert harness.run(harness.client.zcard(log)) == 1


def test_redis_clock_when_now_is_omitted(harness: Harness) -> None:
    key = f"{{n}}:{uuid.uuid4().hex}"
    hit = Hit(("n",), (Limit(3, 60, ALGORITHMS["gcra"], 3),), 2)
    ((outcome,),) = harness.run(harness.script([key], [hit]))
    assert outcome == Outcome(True, 1, 40.0)
    assert 0 < harness.run(harness.client.pttl(key)) <= 41_000


def test_pipelines_queue_and_decode(harness: Harness) -> None:
    key = f"{{p}}:{uuid.uuid4().hex}"
    hits = [Hit(("p",), (Limit(2, 1, ALGORITHMS["leaky_bucket"], 2),), 1)]
    pipeline = harness.client.pipeline(transaction=False)
    for _ in range(2):
        pipeline.eval(SCRIPT_SOURCE, 1, key, *encode_args(hits, 5.0))
    first, second = harness.run(pipeline.execute())
    assert decode_result(first, hits) == [(Outcome(True, 1, 0.5),)]
    assert decode_result(second, hits) == [(Outcome(True, 0, 1.0, delay_s=0.5),)]


def test_survives_a_script_cache_flush(harness: Harness) -> None:
    harness.run(harness.client.script_flush())
    hits = [Hit(("s",), (Limit(1, 1, ALGORITHMS["fixed_window"]),), 1)]
    assert harness.run(harness.script([f"{{s}}:{uuid.uuid4().hex}"], hits, 1.0))[0][0].allowed


def test_bad_calls_fail_before_writing(harness: Harness) -> None:
    hits = [Hit(("b",), (Limit(1, 1, ALGORITHMS["fixed_window"]),), 1)]
    with pytest.raises(ValueError):
        harness.run(harness.script(["a", "b"], hits, 1.0))
    key = f"{{b}}:{uuid.uuid4().hex}"
    args = encode_args(hits, 1.0) + ["1", "1", "no_such_algorithm", "1", "1", "0"]
    with pytest.raises(Exception, match="unknown algorithm"):
        harness.run(harness.client.evalsha(harness.script._script.sha, 2, key, key, *args))
    assert harness.run(harness.client.exists(key)) == 0


@pytest.mark.parametrize("algorithm", SCHEDULES)
def test_fresh_bursts_through_redis_admit_exactly_the_burst(
    harness: Harness, algorithm: str
) -> None:
    # One call per burst: burst + 1 hits of cost 1 on a new key at one instant.
    for t in (0.0, 1000.0, 1_764_000_000.123):
        for rate in range(1, 201):
            limit = Limit(rate, 60, ALGORITHMS[algorithm], rate)
            hits = [Hit(("b",), (limit,), 1)] * (rate + 1)
            key = f"{{burst}}:{uuid.uuid4().hex}"
            got = harness.run(harness.script([key] * len(hits), hits, t))
            assert [o.allowed for (o,) in got] == [True] * rate + [False], (rate, t)
            assert _exact(got) == _exact(MemoryBackend().apply_now(hits, t))
            harness.run(harness.client.delete(key))


@pytest.mark.parametrize("algorithm", SCHEDULES)
@settings(max_examples=examples(40), deadline=None)
@given(shape=schedule_limits, t0=schedule_times, data=st.data())
def test_schedules_match_memory_at_any_rate(harness: Harness, algorithm: str, shape, t0, data):
    """Rates, periods and bursts far beyond ``traffic``'s, with bursts and idle spells."""
    rate, period, burst = shape
    limit = Limit(rate, period, ALGORITHMS[algorithm], burst)
    interval = period / rate
    steps = []
    for _ in range(data.draw(st.integers(1, 8), label="steps")):
        dt = data.draw(st.one_of(time_steps, st.sampled_from([interval, interval * burst])))
        costs = data.draw(st.lists(st.integers(0, burst + 1), min_size=1, max_size=60))
        steps.append((dt, [Hit(("w",), (limit,), cost) for cost in costs]))
    _replay(harness, t0, steps)


def _g17(x: float) -> bytes:
    return format(x, ".17g").encode()  # Lua's fmt, '%.17g'


def _as_old_instances_read(harness: Harness, key: str) -> float | None:
    """The value as an old instance's ``tonumber(redis.call('GET', key))`` reads it."""
    script = (
        "local v = tonumber(redis.call('GET', KEYS[1])) "
        "if v then return string.format('%.17g', v) end"
    )
    raw = harness.run(harness.client.eval(script, 1, key))
    return None if raw is None else float(raw)


@pytest.mark.parametrize("algorithm", SCHEDULES)
def test_state_format_old_instances_read_the_time(harness: Harness, algorithm: str) -> None:
    module, _ = SCHEDULES[algorithm]
    limit = Limit(50, 60, ALGORITHMS[algorithm], 50)  # T = 1.2 s
    key = f"{{fmt}}:{uuid.uuid4().hex}"
    state = None
    for t in (1_764_000_000.123, 1_764_000_000.123, 1_764_000_001.5):
        harness.run(harness.script([key], [Hit(("f",), (limit,), 7)], t))
        state, _ = module.step(state, limit, t, 7)
        at = module.expires_at(state, limit)
        # '<at>\0<base>\0<cells>'; Lua 5.1's tonumber stops at the NUL: at, the TAT.
        assert harness.run(harness.client.get(key)) == b"\0".join(
            (_g17(at), _g17(state.base), b"%d" % state.cells)
        )
        assert _as_old_instances_read(harness, key) == at


@pytest.mark.parametrize("algorithm", SCHEDULES)
def test_state_format_old_values_read_as_a_base_with_no_cells(
    harness: Harness, algorithm: str
) -> None:
    module, state_type = SCHEDULES[algorithm]
    limit = Limit(50, 60, ALGORITHMS[algorithm], 50)
    at = 1_764_000_037.3000002  # as an old instance would have left it
    for t, cost in ((1_764_000_000.123, 1), (1_764_000_000.123, 3), (1_764_000_036.0, 50)):
        key = f"{{old}}:{uuid.uuid4().hex}"
        harness.run(harness.client.set(key, _g17(at), px=600_000))
        ((got,),) = harness.run(harness.script([key], [Hit(("o",), (limit,), cost)], t))
        new, expected = module.step(state_type(at), limit, t, cost)
        assert _exact([(got,)]) == _exact([(expected,)]), (t, cost)
        if got.allowed:
            stored = harness.run(harness.client.get(key)).split(b"\0")
            assert stored[1:] == [_g17(new.base), b"%d" % new.cells]
        harness.run(harness.client.delete(key))


@pytest.mark.parametrize("algorithm", SCHEDULES)
def test_state_format_cells_fold_alike(harness: Harness, algorithm: str) -> None:
    module, state_type = SCHEDULES[algorithm]
    limit = Limit(7, 3, ALGORITHMS[algorithm], 5)
    t = 1_764_000_000.123
    busy = state_type(t - (FOLD_CELLS - 3) * (3 / 7), FOLD_CELLS - 2)
    for cost in (0, 1, 2, 3, 4):
        key = f"{{fold}}:{uuid.uuid4().hex}"
        value = b"\0".join(
            (_g17(module.expires_at(busy, limit)), _g17(busy.base), b"%d" % busy.cells)
        )
        harness.run(harness.client.set(key, value, px=600_000))
        ((got,),) = harness.run(harness.script([key], [Hit(("o",), (limit,), cost)], t))
        new, expected = module.step(busy, limit, t, cost)
        assert _exact([(got,)]) == _exact([(expected,)]), cost
        if got.allowed and cost > 0:
            stored = harness.run(harness.client.get(key)).split(b"\0")
            assert stored[1:] == [_g17(new.base), b"%d" % new.cells]
        harness.run(harness.client.delete(key))


@pytest.mark.parametrize("algorithm", SCHEDULES)
def test_a_rolling_upgrade_never_over_admits(harness: Harness, algorithm: str) -> None:
    """Old and new instances taking turns on one key admit what either would alone."""
    old = harness.client.register_script(OLD_SCRIPT_SOURCE)
    new = harness.script

    def call(script, key: str, hits: list[Hit], t: float) -> list[tuple[Outcome, ...]]:
        if script is new:
            return harness.run(new([key] * len(hits), hits, t))
        raw = harness.run(old(keys=[key] * len(hits), args=encode_args(hits, t)))
        return decode_result(raw, hits)

    t0 = 1_764_000_000.123
    for rate in range(1, 101):
        limit = Limit(rate, 60, ALGORITHMS[algorithm], rate)
        key = f"{{roll}}:{uuid.uuid4().hex}"
        admitted = 0
        for i in range(rate + 2):  # a burst at one instant, alternating instances
            ((outcome,),) = call((new, old)[i % 2], key, [Hit(("r",), (limit,), 1)], t0)
            admitted += outcome.allowed
        # The old instances may fall one short (the bug this format fixes), never over.
        assert rate - 1 <= admitted <= rate, (rate, admitted)
        harness.run(harness.client.delete(key))
    # Saturation over time, the instances taking turns at random: the rate still holds.
    limit = Limit(7, 3, ALGORITHMS[algorithm], 4)
    key = f"{{roll}}:{uuid.uuid4().hex}"
    gap = 3 / 7 / 2.5
    admitted = 0
    for i in range(3000):
        script = (new, old)[(i * 7919) % 3 == 0]
        ((outcome,),) = call(script, key, [Hit(("r",), (limit,), 1)], t0 + i * gap)
        admitted += outcome.allowed
    check_saturated_rate(limit, admitted, 2999 * gap)
    harness.run(harness.client.delete(key))


def test_fixed_window_sets_the_expiry_once_per_window(harness: Harness) -> None:
    # Later hits in a window would set the same expiry again (the window's end), so the
    # script leaves it alone: two commands per hit (HMGET, HSET) instead of three.
    key = f"{{e}}:{uuid.uuid4().hex}"
    hit = Hit(("e",), (Limit(5, 60, ALGORITHMS["fixed_window"]),), 1)
    harness.run(harness.script([key], [hit], 120.5))
    assert 0 < harness.run(harness.client.pttl(key)) <= 61_000
    harness.run(harness.client.persist(key))  # to see whether the next hit sets one
    ((outcome,),) = harness.run(harness.script([key], [hit], 150.0))
    assert outcome == Outcome(True, 3, 30.0)
    assert harness.run(harness.client.pttl(key)) == -1
    ((outcome,),) = harness.run(harness.script([key], [hit], 180.25))  # the next window
    assert outcome == Outcome(True, 4, 59.75)
    assert 0 < harness.run(harness.client.pttl(key)) <= 61_000


def test_fixed_window_state_is_shared_with_the_previous_script(harness: Harness) -> None:
    """A rolling upgrade: instances of the previous version (which set the expiry on every
    hit) and of this one count in the same hash, alternating, and never over-admit."""
    assert OLD_FIXED_WINDOW_SOURCE != SCRIPT_SOURCE
    old = harness.client.register_script(OLD_FIXED_WINDOW_SOURCE)
    limit = Limit(10, 60, ALGORITHMS["fixed_window"])
    key = f"{{fw-roll}}:{uuid.uuid4().hex}"
    hits = [Hit(("r",), (limit,), 1)]
    allowed = []
    for i in range(14):
        t = 1_764_000_000.5 + i  # one window: [1_763_999_980, +60)
        if i % 2:
            raw = harness.run(old(keys=[key], args=encode_args(hits, t)))
            ((outcome,),) = decode_result(raw, hits)
        else:
            ((outcome,),) = harness.run(harness.script([key], hits, t))
        allowed.append(outcome.allowed)
        assert harness.run(harness.client.pttl(key)) > 0
    assert allowed == [True] * 10 + [False] * 4
    assert harness.run(harness.client.hget(key, "c")) == b"14"


# Calendar windows: the script steps with the boundaries Python sends, so the two agree.
CALENDAR_ZONES = ["UTC", "Europe/Paris", "America/Santiago", "America/Sao_Paulo", "Pacific/Apia"]


@st.composite
def calendar_traffic(draw: st.DrawFn):
    algorithm = draw(st.sampled_from(["fixed_window", "sliding_window_counter"]))
    unit = draw(st.sampled_from(CALENDAR_UNITS))
    zone = draw(st.sampled_from(CALENDAR_ZONES))
    rate = draw(st.one_of(st.integers(0, 6), st.just(50)))
    limit = Limit(
        rate, unit.seconds, ALGORITHMS[algorithm], rate, calendar=calendar_for(unit, zone)
    )
    # Start just before a boundary (a DST change or a month's end, for some draws), then
    # steps of seconds to months.
    t0 = draw(st.floats(1_300_000_000.0, 1_900_000_000.0))
    t0 = limit.calendar.boundaries(t0)[4] - draw(st.floats(0.0, 90.0))
    steps = []
    for _ in range(draw(st.integers(1, 15))):
        dt = draw(st.one_of(time_steps, st.sampled_from([3600.0, 86400.0, 2_678_400.0])))
        steps.append((dt, [Hit(("cal",), (limit,), draw(st.integers(0, 7)))]))
    return t0, steps


@settings(max_examples=examples(80), deadline=None)
@given(case=calendar_traffic())
def test_calendar_windows_match_memory(harness: Harness, case) -> None:
    _replay(harness, *case)


@pytest.mark.parametrize("algorithm", ["fixed_window", "sliding_window_counter"])
@pytest.mark.parametrize("skew_s", [-30.0, 30.0])
def test_calendar_windows_with_redis_clock_ahead_or_behind(
    harness: Harness, algorithm: str, skew_s: float
) -> None:
    # Sluice lays the windows out from its clock (at); Redis decides on its own (now), a
    # boundary away: the window Redis is in is among those sent, and it decides as memory
    # would at Redis's time.
    limit = Limit(
        3,
        Unit.MONTH.seconds,
        ALGORITHMS[algorithm],
        3,
        calendar=calendar_for(Unit.MONTH, "Europe/Paris"),
    )
    boundary = float(limit.calendar.boundaries(1_775_000_000.0)[4])
    key = f"{{k}}:{uuid.uuid4().hex}"
    memory = MemoryBackend()
    for redis_now in (boundary - 10.0, boundary + 5.0):
        hits = [Hit(("k",), (limit,), 2)]
        got = harness.run(harness.script([key], hits, redis_now, at=redis_now - skew_s))
        assert _exact(got) == _exact(memory.apply_now(hits, redis_now))
    harness.run(harness.client.delete(key))


def test_a_clock_outside_the_calendar_windows_sent_fails_before_writing(harness: Harness) -> None:
    limit = Limit(
        3, Unit.DAY.seconds, ALGORITHMS["fixed_window"], 3, calendar=calendar_for(Unit.DAY, "UTC")
    )
    key = f"{{o}}:{uuid.uuid4().hex}"
    hits = [Hit(("o",), (limit,), 1)]
    with pytest.raises(Exception, match="outside the calendar windows sent"):
        harness.run(harness.script([key], hits, 1_700_000_000.0 + 3 * 86400, at=1_700_000_000.0))
    assert harness.run(harness.client.exists(key)) == 0


def test_malformed_calendar_boundaries_are_refused(harness: Harness) -> None:
    key = f"{{m}}:{uuid.uuid4().hex}"
    for period in ("1,2,3", "8,7,6,5,4,3,2,1", "1,2,x,4,5,6,7,8"):
        args = ["100.0", "1", "1", "fixed_window", "1", period, "0"]
        with pytest.raises(Exception, match="bad limit"):
            harness.run(harness.client.evalsha(harness.script._script.sha, 1, key, *args))
    args = ["100.0", "1", "1", "gcra", "1", "1,2,3,4,5,6,7,8", "1"]  # no windows to align
    with pytest.raises(Exception, match="bad limit"):
        harness.run(harness.client.evalsha(harness.script._script.sha, 1, key, *args))
