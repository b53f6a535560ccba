"""Calendar windows: where they start in every zone, and the algorithms stepping through them.

Hypothesis draws instants and zones, weighted towards the places calendars go wrong:
daylight-saving changes (at midnight too: America/Santiago, America/Havana, Brazil's old
rules), month and year ends, and Pacific/Apia's skipped 2011-12-30.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, available_timezones

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sluice.algorithms import ALGORITHMS, Limit, fixed_window, sliding_window_counter
from sluice.algorithms.calendar import CALENDAR_UNITS, SPAN, Calendar, calendar_for, window_index
from sluice.model import Unit
from tests.support.algorithm_properties import check_sequence
from tests.support.examples import examples

ZONES = sorted(available_timezones())
AWKWARD_ZONES = [
    "UTC",
    "Europe/Paris",
    "America/New_York",
    "America/Santiago",  # DST changes at midnight
    "America/Havana",  # likewise
    "America/Sao_Paulo",  # until 2019: the clock went back from 00:00 to 23:00
    "Asia/Beirut",
    "Australia/Lord_Howe",  # half-hour DST
    "Asia/Kolkata",  # +05:30
    "Pacific/Apia",  # skipped 2011-12-30 entirely
    "Pacific/Kiritimati",  # +14
    "Pacific/Pago_Pago",  # -11
]
zones = st.one_of(st.sampled_from(AWKWARD_ZONES), st.sampled_from(ZONES))
units = st.sampled_from(CALENDAR_UNITS)
# 1972 (whole-second offsets since) to 2100; and instants a few seconds around midnights,
# DST changes and month ends, where the boundaries are.
instants = st.one_of(
    st.floats(63_072_000.0, 4_102_444_800.0, allow_nan=False),
    st.builds(
        lambda day, offset_s: (
            datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp() + offset_s
        ),
        st.dates(date(1972, 1, 1), date(2099, 12, 1)),
        st.floats(-14 * 3600.0 - 5, 14 * 3600.0 + 5, allow_nan=False),
    ),
)


def _local(t: float, zone: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(t, zone).replace(tzinfo=None)


def _first_day(day: date, unit: Unit) -> date:
    if unit is Unit.WEEK:
        return day - timedelta(days=day.weekday())
    if unit is Unit.MONTH:
        return day.replace(day=1)
    if unit is Unit.YEAR:
        return day.replace(month=1, day=1)
    return day


@settings(max_examples=examples(400), deadline=None)
@given(zone=zones, unit=units, now=instants)
@example(zone="Pacific/Apia", unit=Unit.DAY, now=1325239200.0)  # 2011-12-31 00:00 local
@example(zone="America/Sao_Paulo", unit=Unit.DAY, now=1550372400.0)  # 2019-02-16 23:00 fold
@example(zone="America/Santiago", unit=Unit.MONTH, now=1567310400.0)  # DST at midnight
def test_boundaries_are_the_first_instants_of_their_days(zone: str, unit: Unit, now: float):
    calendar = Calendar(unit, zone)
    bounds = calendar.boundaries(now)
    assert len(bounds) == SPAN and bounds[3] <= now < bounds[4]
    assert list(bounds) == sorted(set(bounds))
    tz = calendar.zone
    for b in bounds:
        day = _local(b, tz).date()
        # A window starts on its first day (midnight, or the end of a gap over midnight) ...
        assert _first_day(day, unit) == day, (b, _local(b, tz))
        # ... at the first instant the clock shows that day: a second before, it did not.
        assert _local(b - 1, tz).date() < day, (b, _local(b - 1, tz))
    for b, nxt in zip(bounds, bounds[1:], strict=False):
        # No window start is missed in between: the clock shows no later first day.
        last = _local(nxt - 1, tz).date()
        assert _first_day(last, unit) <= _local(b, tz).date(), (b, nxt)


@settings(max_examples=examples(200), deadline=None)
@given(zone=zones, unit=units, now=instants, later_s=st.floats(0.0, 400 * 86400.0))
def test_the_cache_gives_what_a_fresh_calendar_computes(zone, unit, now, later_s):
    shared = Calendar(unit, zone)
    shared.boundaries(now)
    assert shared.boundaries(now + later_s) == Calendar(unit, zone).boundaries(now + later_s)


def test_a_month_in_paris_across_the_october_dst_change() -> None:
    calendar = calendar_for(Unit.MONTH, "Europe/Paris")
    october = datetime(2026, 10, 15, 12, tzinfo=ZoneInfo("Europe/Paris")).timestamp()
    bounds = calendar.boundaries(october)
    i = window_index(bounds, october)
    start = datetime(2026, 10, 1, tzinfo=ZoneInfo("Europe/Paris")).timestamp()
    end = datetime(2026, 11, 1, tzinfo=ZoneInfo("Europe/Paris")).timestamp()
    assert (bounds[i], bounds[i + 1]) == (start, end)
    assert end - start == 31 * 86400 + 3600  # October gains the hour the clock goes back
    assert calendar_for(Unit.MONTH, "Europe/Paris") is calendar


def test_iso_weeks_start_on_monday() -> None:
    wednesday = datetime(2026, 11, 25, 15, tzinfo=UTC).timestamp()
    bounds = calendar_for(Unit.WEEK, "UTC").boundaries(wednesday)
    assert datetime.fromtimestamp(bounds[3], UTC) == datetime(2026, 11, 23, tzinfo=UTC)
    assert bounds[4] - bounds[3] == 7 * 86400


def test_shorter_units_are_no_calendar() -> None:
    with pytest.raises(ValueError, match="days, weeks, months or years"):
        Calendar(Unit.HOUR, "UTC")


def _calendar_limit(algorithm: str, unit: Unit, zone: str, rate: int) -> Limit:
    return Limit(rate, unit.seconds, ALGORITHMS[algorithm], rate, calendar=calendar_for(unit, zone))


# Big steps too, so sequences cross boundaries; starts just before them.
calendar_steps = st.lists(
    st.tuples(
        st.one_of(st.floats(0.0, 200.0), st.sampled_from([3600.0, 86400.0, 31 * 86400.0])),
        st.integers(0, 8),
    ),
    min_size=1,
    max_size=20,
)


@settings(max_examples=examples(150), deadline=None)
@given(
    zone=zones,
    unit=units,
    now=instants,
    rate=st.one_of(st.integers(0, 6), st.just(50)),
    before_s=st.floats(0.0, 120.0),
    steps=calendar_steps,
)
def test_sliding_counter_keeps_every_property_and_resets_are_never_early(
    zone, unit, now, rate, before_s, steps
) -> None:
    limit = _calendar_limit("sliding_window_counter", unit, zone, rate)
    bounds = limit.calendar.boundaries(now)
    # check_sequence: resets never early nor late, remaining exact, expiry like no state.
    check_sequence(sliding_window_counter, limit, bounds[4] - before_s, steps)


@settings(max_examples=examples(150), deadline=None)
@given(
    zone=zones,
    unit=units,
    now=instants,
    rate=st.integers(0, 6),
    before_s=st.floats(0.0, 120.0),
    steps=calendar_steps,
)
def test_fixed_window_counts_each_calendar_window_and_resets_at_its_end(
    zone, unit, now, rate, before_s, steps
) -> None:
    limit = _calendar_limit("fixed_window", unit, zone, rate)
    t = limit.calendar.boundaries(now)[4] - before_s
    state, count = None, 0
    for dt, cost in steps:
        t += dt
        bounds = Calendar(unit, zone).boundaries(t)  # computed afresh, not from the cache
        if state is None or state.window_start_s != bounds[3]:
            count = 0
        count += cost
        state, outcome = fixed_window.step(state, limit, t, cost)
        assert state.window_start_s == bounds[3]
        assert outcome.allowed == (count <= rate)
        # The reset is the next boundary exactly: never early, and the window is fresh there.
        assert t + outcome.reset_s == bounds[4]
        assert fixed_window.step(state, limit, float(bounds[4]), 0)[0].count == 0


@settings(max_examples=examples(100), deadline=None)
@given(zone=zones, unit=units, now=instants, cost=st.integers(1, 3))
def test_a_fixed_window_resets_exactly_at_the_next_boundary(zone, unit, now, cost) -> None:
    limit = _calendar_limit("fixed_window", unit, zone, 3)
    bounds = limit.calendar.boundaries(now)
    state, outcome = fixed_window.step(None, limit, now, cost)
    assert state.window_start_s == bounds[3]
    assert now + outcome.reset_s == bounds[4]
    assert fixed_window.expires_at(state, limit) == bounds[4]
    # Full until the boundary, fresh from it.
    state, _ = fixed_window.step(state, limit, now, 3)
    assert not fixed_window.step(state, limit, now, 1)[1].allowed
    assert fixed_window.step(state, limit, float(bounds[4]), 3)[1].allowed


def test_sliding_counter_weighs_the_previous_month_by_this_months_length() -> None:
    limit = _calendar_limit("sliding_window_counter", Unit.MONTH, "UTC", 100)
    jan = datetime(2026, 1, 10, tzinfo=UTC).timestamp()
    feb_7 = datetime(2026, 2, 7, tzinfo=UTC).timestamp()
    feb_8 = datetime(2026, 2, 8, tzinfo=UTC).timestamp()  # 7 of February's 28 days gone
    state, _ = sliding_window_counter.step(None, limit, jan, 80)
    assert sliding_window_counter.estimate(state, limit, feb_8) == 80 * 21 / 28
    refused, outcome = sliding_window_counter.step(state, limit, feb_7, 40)
    assert refused is state and not outcome.allowed  # 80 * 22/28 + 40 > 100
    # 80 * (28 d - e) / 28 d + 40 <= 100 from e = 7 d: February 8, midnight.
    assert feb_7 + outcome.reset_s == feb_8
    assert sliding_window_counter.step(state, limit, feb_8, 40)[1].allowed
