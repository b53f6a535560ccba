"""whatif.py against hand-computed numbers, and the What-if page showing the same figures."""

from __future__ import annotations

from sluice.algorithms import ALGORITHMS, Limit
from sluice.clock import ManualClock
from sluice.usage.store import UsagePoint, UsageStore
from sluice_admin.whatif import Second, bursty, recorded, simulate, steady
from tests.admin._harness import charts, metric, new_app, no_exceptions, open_page, sign_in


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
