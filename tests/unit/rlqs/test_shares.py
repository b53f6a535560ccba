"""A stream's claim on a limit: its reported demand plus a floor."""

from __future__ import annotations

from sluice.rlqs.shares import FLOOR, Demand, weight


def test_every_stream_weighs_a_floor_beyond_its_demand() -> None:
    assert weight(0.0, 100.0) == FLOOR * 100
    assert weight(30.0, 100.0) == 30 + FLOOR * 100


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
