"""Splitting one limit between streams by their reported demand."""

from __future__ import annotations

import pytest

from sluice.rlqs.shares import FLOOR, Demand, Totals, share


def test_one_stream_holds_the_whole_limit_whatever_its_demand() -> None:
    assert share(0.0, Totals(0.0, 1), 10.0) == 1.0
    assert share(500.0, Totals(500.0, 1), 10.0) == 1.0


def test_shares_follow_demand_and_add_up_to_one() -> None:
    demands = [90.0, 10.0, 0.0]
    totals = Totals(sum(demands), len(demands))
    shares = [share(d, totals, 10.0) for d in demands]
    assert sum(shares) == pytest.approx(1.0)
    assert shares[0] > shares[1] > shares[2] > 0
    # The quiet stream keeps the floor: its weight is FLOOR x the rate.
    assert shares[2] == pytest.approx(FLOOR * 10 / (100 + 3 * FLOOR * 10))


def test_streams_with_no_demand_split_evenly() -> None:
    assert share(0.0, Totals(0.0, 4), 10.0) == pytest.approx(0.25)


def test_totals_that_miss_this_stream_never_give_more_than_all() -> None:
    # An exchange that has not seen this stream's latest demand yet.
    assert share(50.0, Totals(10.0, 1), 10.0) == 1.0


def test_demand_is_the_rate_of_the_last_reports() -> None:
    demand = Demand()
    assert demand.per_second == 0.0
    demand.report(7, 0.0)  # a first report: no elapsed time, no rate
    assert demand.per_second == 0.0
    demand.report(50, 5.0)
    assert demand.per_second == 10.0
    demand.report(150, 5.0)
    assert demand.per_second == 20.0  # 200 over 10 s
    demand.report(0, 5.0)  # traffic stopped: the oldest report leaves the window
    assert demand.per_second == 15.0
    demand.report(0, 5.0)
    assert demand.per_second == 0.0  # unused share flows back within two reports
