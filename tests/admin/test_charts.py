"""The admin app's charts as Vega-Lite specs: what each one plots (its data, melted to long
form), how (mark, encodings, stacking) and what the reader is told (axis titles, time scale,
units, the fixed colours of each outcome)."""

from __future__ import annotations

from typing import Any

from sluice_admin.charts import TIME_FORMAT, sparkline, traffic, what_if
from sluice_admin.metrics import Row
from sluice_admin.whatif import Replay, Second

T0 = 1_764_000_000  # 2025-11-24 16:00:00 UTC
OUTCOME_COLORS = {
    "domain": ["admitted", "rejected", "rejected (shadow)"],
    "range": ["#4c9a2a", "#d1495b", "#edae49"],
}
ROWS = [Row(T0, 5, 2, 1, 0, 0), Row(T0 + 60, 3, 0, 0, 4, 1)]
# One format on every time axis: 24-hour UTC with seconds (never "08 AM" beside "07:35").
TIME_AXIS = {
    "field": "time",
    "type": "temporal",
    "title": "time (UTC)",
    "axis": {
        "format": "%H:%M:%S",
        "labelAngle": 0,
        "labelOverlap": "greedy",
        "tickMinStep": 1000,  # ms: no sub-second ticks all labelled with the same second
    },
}


def data(spec: dict[str, Any], layer: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The rows a (layer of a) chart plots: altair keeps them in the top-level datasets."""
    return spec["datasets"][(layer or spec)["data"]["name"]]


def test_sparkline_plots_all_requests_and_the_rejected_ones() -> None:
    spec = sparkline(ROWS).to_dict()
    assert data(spec) == [
        # requests: admitted + rejected + shadow-rejected; near_limit and errors are not added
        {"time": "2025-11-24T16:00:00+00:00", "series": "requests", "per second": 8},
        {"time": "2025-11-24T16:01:00+00:00", "series": "requests", "per second": 3},
        {"time": "2025-11-24T16:00:00+00:00", "series": "rejected", "per second": 2},
        {"time": "2025-11-24T16:01:00+00:00", "series": "rejected", "per second": 0},
    ]
    assert spec["mark"] == {"type": "line", "strokeWidth": 1.5}
    # Tall enough for a plot: Streamlit fits axes and legend into the height too.
    assert spec["height"] == 180
    encoding = spec["encoding"]
    assert encoding["x"] == TIME_AXIS
    assert encoding["y"] == {"field": "per second", "type": "quantitative", "title": "req / s"}
    assert encoding["color"] == {
        "field": "series",
        "type": "nominal",
        "scale": {"domain": ["requests", "rejected"], "range": ["#30638e", "#d1495b"]},
        # beside the plot: a legend below took the whole height (the plot was 0 px high)
        "legend": {"orient": "right", "title": None},
    }


def test_traffic_stacks_each_outcome_per_bucket() -> None:
    spec = traffic(ROWS, 60).to_dict()
    assert data(spec) == [
        {"time": "2025-11-24T16:00:00+00:00", "outcome": "admitted", "requests": 5},
        {"time": "2025-11-24T16:01:00+00:00", "outcome": "admitted", "requests": 3},
        {"time": "2025-11-24T16:00:00+00:00", "outcome": "rejected", "requests": 2},
        {"time": "2025-11-24T16:01:00+00:00", "outcome": "rejected", "requests": 0},
        {"time": "2025-11-24T16:00:00+00:00", "outcome": "rejected (shadow)", "requests": 1},
        {"time": "2025-11-24T16:01:00+00:00", "outcome": "rejected (shadow)", "requests": 0},
    ]
    assert spec["mark"] == {"type": "bar"}
    assert spec["height"] == 260
    encoding = spec["encoding"]
    assert encoding["x"] == TIME_AXIS
    assert encoding["y"] == {
        "field": "requests",
        "type": "quantitative",
        "stack": "zero",
        "title": "requests / min",
    }
    assert encoding["color"] == {
        "field": "outcome",
        "type": "nominal",
        "scale": OUTCOME_COLORS,
        "title": None,
    }
    assert encoding["tooltip"] == [
        {"field": "time", "type": "temporal", "format": TIME_FORMAT, "title": "time (UTC)"},
        {"field": "outcome", "type": "nominal"},
        {"field": "requests", "type": "quantitative"},
    ]


def test_traffic_names_the_unit_of_its_resolution() -> None:
    assert traffic(ROWS, 1).to_dict()["encoding"]["y"]["title"] == "requests / s"
    assert traffic(ROWS, 60).to_dict()["encoding"]["y"]["title"] == "requests / min"


PROPOSED = Replay([Second(T0, 3, 1), Second(T0 + 1, 2, 2)])
CURRENT = Replay([Second(T0, 4, 0), Second(T0 + 1, 3, 1)])


def test_what_if_alone_is_the_proposal_stacked_over_time() -> None:
    spec = what_if(PROPOSED, None).to_dict()
    assert "layer" not in spec
    assert data(spec) == [
        {"time": "2025-11-24T16:00:00+00:00", "outcome": "admitted", "requests": 3},
        {"time": "2025-11-24T16:00:00+00:00", "outcome": "rejected", "requests": 1},
        {"time": "2025-11-24T16:00:01+00:00", "outcome": "admitted", "requests": 2},
        {"time": "2025-11-24T16:00:01+00:00", "outcome": "rejected", "requests": 2},
        # the closing zero: the last second is a step of one second's width
        {"time": "2025-11-24T16:00:02+00:00", "outcome": "admitted", "requests": 0},
        {"time": "2025-11-24T16:00:02+00:00", "outcome": "rejected", "requests": 0},
    ]
    assert spec["mark"] == {"type": "area", "interpolate": "step-after", "opacity": 0.8}
    assert spec["height"] == 280
    encoding = spec["encoding"]
    assert encoding["x"] == TIME_AXIS
    assert encoding["y"] == {
        "field": "requests",
        "type": "quantitative",
        "stack": "zero",
        "title": "requests / s",
    }
    assert encoding["color"] == {
        "field": "outcome",
        "type": "nominal",
        "scale": OUTCOME_COLORS,
        "title": "proposed",
    }


def test_what_if_draws_the_current_rejections_over_the_proposal() -> None:
    spec = what_if(PROPOSED, CURRENT, relative=True).to_dict()
    assert spec["height"] == 280
    area, line = spec["layer"]
    # relative: seconds from the proposal's first second, on a linear axis
    seconds = {"field": "time", "type": "quantitative", "title": "seconds from start"}
    assert data(spec, area) == [
        {"time": 0, "outcome": "admitted", "requests": 3},
        {"time": 0, "outcome": "rejected", "requests": 1},
        {"time": 1, "outcome": "admitted", "requests": 2},
        {"time": 1, "outcome": "rejected", "requests": 2},
        {"time": 2, "outcome": "admitted", "requests": 0},
        {"time": 2, "outcome": "rejected", "requests": 0},
    ]
    assert area["mark"]["type"] == "area"
    assert area["encoding"]["x"] == seconds
    assert area["encoding"]["y"]["stack"] == "zero"
    assert data(spec, line) == [
        {"time": 0, "rejected now": 0},
        {"time": 1, "rejected now": 1},
        {"time": 2, "rejected now": 0},
    ]
    assert line["mark"] == {
        "type": "line",
        "color": "black",
        "strokeDash": [4, 3],
        "strokeWidth": 1.5,
        "interpolate": "step-after",  # no diagonals: a count holds for its own second only
    }
    assert line["encoding"] == {
        "x": seconds,
        "y": {"field": "rejected now", "type": "quantitative", "title": "requests / s"},
    }


def test_what_if_with_no_traffic_is_an_empty_chart_with_its_axes() -> None:
    spec = what_if(Replay([]), Replay([])).to_dict()
    area, line = spec["layer"]
    assert data(spec, area) == [] and data(spec, line) == []
    assert area["encoding"]["x"]["title"] == "time (UTC)"
    assert line["encoding"]["y"]["field"] == "rejected now"


def test_what_if_draws_seconds_without_recorded_traffic_as_zero() -> None:
    # Recorded traffic keeps only the seconds that had requests: the chart must not hold the
    # last value across a gap (the area) nor draw a diagonal over it (the line).
    proposed = Replay([Second(T0, 3, 1), Second(T0 + 3, 2, 2)])
    current = Replay([Second(T0, 4, 0), Second(T0 + 3, 1, 3)])
    spec = what_if(proposed, current).to_dict()
    area, line = spec["layer"]
    rejected = [r["requests"] for r in data(spec, area) if r["outcome"] == "rejected"]
    assert rejected == [1, 0, 0, 2, 0]
    assert [r["rejected now"] for r in data(spec, line)] == [0, 0, 0, 3, 0]
    assert area["mark"]["interpolate"] == line["mark"]["interpolate"] == "step-after"
