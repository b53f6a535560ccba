"""whatif.py against hand-computed numbers, and the What-if page showing the same figures."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sluice.algorithms import ALGORITHMS, Limit
from sluice.clock import ManualClock
from sluice.usage.key_summary import KeySummary
from sluice.usage.store import KeyRecord, UsagePoint, UsageStore
from sluice_admin.suggest import PeakRates, peak_rates, suggested_limit
from sluice_admin.whatif import (
    KeyTraffic,
    Second,
    bursty,
    key_traffic,
    predict,
    recorded,
    simulate,
    spread,
    steady,
)
from tests.admin._harness import charts, codes, metric, new_app, no_exceptions, open_page, sign_in


def test_fixed_window_admits_the_limit_then_refuses_the_rest_of_the_window() -> None:
    replay = simulate([Limit(10, 60, ALGORITHMS["fixed_window"])], steady(3, 10))
    assert replay.seconds[:5] == [
        Second(0, 3, 0),
        Second(1, 3, 0),
        Second(2, 3, 0),
        Second(3, 1, 2),
        Second(4, 0, 3),
    ]
    assert (replay.admitted, replay.rejected) == (10, 20)
    assert replay.rejection_rate == 20 / 30


def test_gcra_spaces_requests_one_interval_apart() -> None:
    # T = 1 s, tau = 1 s: of hits at 0, 0.5, 1, 1.5, ... every other one fits.
    replay = simulate([Limit(1, 1, ALGORITHMS["gcra"], 1)], steady(2, 5))
    assert [(s.admitted, s.rejected) for s in replay.seconds] == [(1, 1)] * 5


def test_token_bucket_refills_between_bursts() -> None:
    # Capacity 5, refilled at 10/60 per s: each burst of 8 (spread over its second) gets 5
    # through; 30 s later the bucket is full again.
    replay = simulate([Limit(10, 60, ALGORITHMS["token_bucket"], 5)], bursty(8, 30, 60))
    assert [
        (s.second, s.admitted, s.rejected) for s in replay.seconds if s.admitted or s.rejected
    ] == [
        (0, 5, 3),
        (30, 5, 3),
    ]


def test_several_limits_all_must_admit_and_fixed_windows_count_refused_hits() -> None:
    # 2/s and 5/min: second 0 admits 2 (the third is refused but counted by the minute
    # window: 3), second 1 admits 2 (count 5), then the minute is spent.
    replay = simulate(
        [Limit(5, 60, ALGORITHMS["fixed_window"]), Limit(2, 1, ALGORITHMS["fixed_window"])],
        steady(3, 3),
    )
    assert [(s.admitted, s.rejected) for s in replay.seconds] == [(2, 1), (2, 1), (0, 3)]


def test_no_limit_admits_everything() -> None:
    assert simulate([], steady(4, 2)).rejected == 0


def test_steady_spreads_fractional_rates_and_bursty_is_periodic() -> None:
    assert steady(0.5, 4) == [(0, 0), (1, 1), (2, 0), (3, 1)]
    assert bursty(7, 3, 7, start_s=100) == [
        (100, 7),
        (101, 0),
        (102, 0),
        (103, 7),
        (104, 0),
        (105, 0),
        (106, 7),
    ]


def test_recorded_traffic_counts_every_decided_request() -> None:
    points = [UsagePoint(10, 3, 2, 1, 2, 9), UsagePoint(11, 0, 0, 0, 0, 4)]
    assert recorded(points) == [(10, 6)]  # near_limit is a subset; errors were not decided


def test_the_replay_keeps_the_most_recent_seconds_within_budget() -> None:
    replay = simulate(
        [Limit(100, 1, ALGORITHMS["fixed_window"])], [(0, 5), (1, 5), (2, 5)], max_hits=11
    )
    assert [s.second for s in replay.seconds] == [1, 2]
    assert replay.skipped_hits == 5


def test_the_page_replays_the_recorded_hour_with_the_servers_algorithms(
    database_url: str, store
) -> None:  # noqa: ANN001
    now = 1_800_000_000  # the page's clock (a ManualClock)
    # 10 requests a second for 20 s on shop.user (5 per minute live).
    start = now - 100
    counts = {
        ("shop.user", start + i): [5 if i == 0 else 0, 5 if i == 0 else 10, 0, 0, 0, 0]
        for i in range(20)
    }
    UsageStore(store.database).add(counts, {})
    traffic = [(start + i, 10) for i in range(20)]
    expect_now = simulate([Limit(5, 60, ALGORITHMS["fixed_window"])], traffic)
    expect_then = simulate([Limit(50, 60, ALGORITHMS["gcra"], 50)], traffic)

    at = open_page(sign_in(new_app(ManualClock(now)), "ed"), "what_if")
    no_exceptions(at)
    at.number_input(key="whatif_rpu_0").set_value(50)
    at.selectbox(key="whatif_alg_0").select("gcra")
    at.run()
    no_exceptions(at)
    assert int(metric(at, "Admitted (proposed)")) == expect_then.admitted
    assert int(metric(at, "Rejected (proposed)")) == expect_then.rejected
    now_line = f"Now: {expect_now.admitted} admitted, {expect_now.rejected} rejected."
    assert any(c.value.startswith(now_line) for c in at.caption)
    assert any("one counter" in i.value for i in at.info)  # the approximation is stated
    # The recorded traffic's chart (time of day; the synthetic traffic's counts seconds from
    # its start): the proposal's admitted and rejected per second, stacked, and the current
    # rule's rejections as a line, each second of the replay and the closing zero after it.
    recorded_charts = [
        c for c in charts(at) if c.spec["layer"][0]["encoding"]["x"]["type"] == "temporal"
    ]
    [chart] = recorded_charts
    area, line = chart.spec["layer"]
    closing = Second(start + 20, 0, 0)
    proposed = {(int(r["time"].timestamp()), r["outcome"]): r["requests"] for r in chart.rows(area)}
    assert proposed == {
        (s.second, outcome): count
        for s in [*expect_then.seconds, closing]
        for outcome, count in (("admitted", s.admitted), ("rejected", s.rejected))
    }
    current = {int(r["time"].timestamp()): r["rejected now"] for r in chart.rows(line)}
    assert current == {s.second: s.rejected for s in [*expect_now.seconds, closing]}
    assert [s.second for s in expect_then.seconds] == list(range(start, start + 20))
    assert area["encoding"]["y"]["title"] == line["encoding"]["y"]["title"] == "requests / s"


# -- per key -------------------------------------------------------------------------------

FIVE_PER_S = [Limit(5, 1, ALGORITHMS["fixed_window"])]


def test_each_key_is_replayed_on_its_own_counter() -> None:
    # Two keys at 10/s for 3 s under 5/s: each gets its 5 a second. One counter for both
    # (the old replay) would admit only 5 a second in all.
    series = [(s, 10) for s in range(3)]
    replay = predict(FIVE_PER_S, KeyTraffic({"user,a": series, "user,b": series}))
    assert [(s.second, s.admitted, s.rejected) for s in replay.seconds] == [
        (0, 10, 10),
        (1, 10, 10),
        (2, 10, 10),
    ]
    assert replay.error_bound == 0  # every hit by name: nothing to guess
    assert simulate(FIVE_PER_S, [(s, 20) for s in range(3)]).admitted == 15


def test_the_unnamed_keys_lie_between_new_keys_and_the_same_keys_throughout() -> None:
    # 4 a minute; the unnamed keys sent 3 hits in second 0 and 3 in second 1. New keys each
    # second: 6 admitted; one key throughout: 4. The prediction is the middle, ± half the gap.
    per_minute = [Limit(4, 60, ALGORITHMS["fixed_window"])]
    replay = predict(per_minute, KeyTraffic(rest={0: [3], 1: [3]}))
    assert (replay.admitted, replay.rejected, replay.error_bound) == (5, 1, 1)


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(sorted(ALGORITHMS)),
    requests_per_unit=st.integers(min_value=1, max_value=12),
    period_s=st.sampled_from([1, 2, 60]),
    burst=st.integers(min_value=1, max_value=12),
    history=st.lists(st.integers(min_value=0, max_value=15), max_size=6),
    hits=st.integers(min_value=1, max_value=20),
)
def test_no_history_admits_the_most_so_new_keys_bound_the_rest(
    name: str, requests_per_unit: int, period_s: int, burst: int, history: list[int], hits: int
) -> None:
    # The error bound's upper end replays each unnamed key-second from no state: that is
    # only a bound if no history ever lets an algorithm admit more.
    limit = [Limit(requests_per_unit, period_s, ALGORITHMS[name], burst)]
    second = len(history)
    with_history = simulate(limit, [*enumerate(history), (second, hits)]).seconds[-1]
    assert with_history.admitted <= simulate(limit, [(second, hits)]).admitted


def test_hits_no_key_accounts_for_could_go_either_way() -> None:
    replay = predict(FIVE_PER_S, KeyTraffic({"user,a": [(0, 2)]}, unaccounted=[(0, 4)]))
    assert (replay.admitted, replay.rejected, replay.error_bound) == (4, 2, 2)


def test_the_store_rows_become_traffic_per_key() -> None:
    record = KeyRecord(
        keys=[(10, "user,a", 7), (11, "user,a", 6), (11, "user,b", 4)],
        bins=[(10, 2, 3, 7), (11, 1, 2, 2)],
    )
    totals = [(10, 14), (11, 15)]  # second 11 holds 3 hits more than the keys account for
    assert key_traffic(record, totals) == KeyTraffic(
        named={"user,a": [(10, 7), (11, 6)], "user,b": [(11, 4)]},
        rest={10: [3, 2, 2], 11: [1, 1]},
        unaccounted=[(11, 3)],
    )
    assert spread(3, 7) == [3, 2, 2]


# -- suggested limits ------------------------------------------------------------------------


def test_peak_rates_count_named_keys_exactly_and_the_busiest_second_of_the_rest() -> None:
    record = KeyRecord(
        keys=[(10, "user,a", 40), (11, "user,a", 90), (10, "user,b", 12)],
        bins=[(10, 1, 5, 5), (11, 2, 2, 4), (11, 1, 1, 1)],  # busiest: second 10, 5 keys
    )
    rates = peak_rates(record)
    assert rates == PeakRates([90, 12, 1, 1, 1, 1, 1], named=2)
    assert (rates.keys, rates.percentile(50), rates.percentile(90), rates.percentile(100)) == (
        7,
        1,
        90,
        90,
    )


def test_the_suggestion_refuses_at_most_the_chosen_share_of_keys() -> None:
    rates = PeakRates([100, 50, 20, 10, *[2] * 96], named=4)
    assert suggested_limit(rates, 1.0) == 50  # one key of 100 above it
    assert suggested_limit(rates, 3.0) == 10  # three above it
    assert suggested_limit(rates, 0.5) == 100  # half a key: none refused
    assert suggested_limit(rates, 100.0) == 2
    assert suggested_limit(PeakRates([], 0), 1.0) is None


def _seed_key_usage(store, now: int, *, ago_s: int = 100) -> None:  # noqa: ANN001
    """20 s of shop.user from ``ago_s`` ago: 'a' at 30/s, 'b' at 8/s, 10 other keys at 1/s."""
    start = now - ago_s
    counts, keys = {}, {}
    for i in range(20):
        counts[("shop.user", start + i)] = [48, 0, 0, 0, 0, 0]
        keys[("shop.user", start + i)] = KeySummary({"user,a": 30, "user,b": 8}, {1: [10, 10]})
    UsageStore(store.database).add(counts, {}, keys)


def test_the_page_predicts_per_key_with_its_error_bound(database_url: str, store) -> None:  # noqa: ANN001
    now = 1_800_000_000
    _seed_key_usage(store, now)
    usage = UsageStore(store.database)
    totals = recorded(usage.series("shop.user", since_s=now - 3600)["shop.user"])
    traffic = key_traffic(usage.key_record("shop.user", since_s=now - 3600), totals)
    proposed = [Limit(10, 1, ALGORITHMS["gcra"], 10)]
    expect = predict(proposed, traffic)
    # Only 'a' (30/s) is over 10/s: per key, 'b' and the others pass; on one counter, all
    # 48/s would share the 10.
    assert 20 * 18 < expect.admitted < 20 * 30
    assert simulate(proposed, totals).admitted < 20 * 11

    at = open_page(sign_in(new_app(ManualClock(now)), "ed"), "what_if")
    at.number_input(key="whatif_rpu_0").set_value(10)
    at.number_input(key="whatif_burst_0").set_value(10)
    at.selectbox(key="whatif_unit_0").select("second")
    at.selectbox(key="whatif_alg_0").select("gcra")
    at.run()
    assert int(metric(at, "Admitted (proposed)")) == expect.admitted
    assert int(metric(at, "Rejected (proposed)")) == expect.rejected
    assert any("per key" in i.value for i in at.info)
    assert not any("one counter" in i.value for i in at.info)


def test_the_suggestion_becomes_a_pending_edit(database_url: str, store) -> None:  # noqa: ANN001
    now = 1_800_000_000
    _seed_key_usage(store, now)
    at = open_page(sign_in(new_app(ManualClock(now)), "ed"), "what_if")
    # 12 keys; refusing the top 10 %: one key ('a', 30/s) above the suggestion of 8/s.
    at.number_input(key="whatif_top_pct").set_value(10.0)
    at.run()
    assert int(metric(at, "Keys")) == 12
    assert int(metric(at, "Max peak / s")) == 30
    assert int(metric(at, "p90 peak / s")) == 8
    assert int(metric(at, "Suggested limit (requests / second)")) == 8
    # Predicted: 'a' gets 8 of its 30 a second, everyone else all of theirs.
    assert int(metric(at, "Rejected (suggested)")) == 20 * 22
    at.button(key="whatif_use_suggestion").click().run()
    assert any("now a pending edit" in s.value for s in at.success)

    at = open_page(at, "rules")
    diff = codes(at)[-1].splitlines()
    assert "-    unit: minute" in diff and "+    unit: second" in diff
    assert "-    requests_per_unit: 5" in diff and "+    requests_per_unit: 8" in diff


def test_a_day_of_peaks_comes_from_the_per_minute_rows(database_url: str, store) -> None:  # noqa: ANN001
    now = 1_800_000_000
    _seed_key_usage(store, now, ago_s=2 * 3600)  # two hours ago: only in the day's window
    UsageStore(store.database).expire(now)  # the per-second rows are gone, as they would be
    at = open_page(sign_in(new_app(ManualClock(now)), "ed"), "what_if")
    assert any(
        "No per-key usage recorded for this rule in the last hour." in c.value for c in at.caption
    )
    at.radio(key="whatif_peak_window").set_value("last day")
    at.run()
    assert (int(metric(at, "Keys")), int(metric(at, "Max peak / s"))) == (12, 30)
    assert int(metric(at, "Suggested limit (requests / second)")) == 30  # 1 % of 12: none
