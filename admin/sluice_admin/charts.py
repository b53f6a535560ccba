"""Altair charts for the pages; every chart has a time axis and a labelled unit.

Every time axis is 24-hour UTC with seconds (``TIME_FORMAT``): Vega's default picks a format
per tick span ("08 AM" beside "07:35"), and minutes alone repeat on a five-minute axis whose
ticks are 30 s apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import altair as alt
import pandas as pd

from sluice_admin.metrics import Row
from sluice_admin.whatif import Replay, Second

__all__ = ["TIME_FORMAT", "sparkline", "traffic", "what_if"]

TIME_FORMAT = "%H:%M:%S"

_COLORS = alt.Scale(
    domain=["admitted", "rejected", "rejected (shadow)"],
    range=["#4c9a2a", "#d1495b", "#edae49"],
)


def _time(bucket_s: int) -> datetime:
    return datetime.fromtimestamp(bucket_s, UTC)


def _time_axis() -> alt.X:
    # No tick closer than a second (ms: the scale's unit), and a label that would overlap the
    # one before is left out: a span of a second or two got sub-second ticks, every one of them
    # labelled with the same second, on top of each other.
    axis = alt.Axis(format=TIME_FORMAT, labelAngle=0, labelOverlap="greedy", tickMinStep=1000)
    return alt.X("time:T", title="time (UTC)", axis=axis)


def _unit(resolution_s: int) -> str:
    return "requests / s" if resolution_s == 1 else "requests / min"


def sparkline(rows: Sequence[Row]) -> alt.Chart:
    frame = pd.DataFrame(
        {
            "time": [_time(r.bucket_s) for r in rows],
            "requests": [r.admitted + r.rejected + r.shadow_rejected for r in rows],
            "rejected": [r.rejected for r in rows],
        }
    ).melt("time", var_name="series", value_name="per second")
    return (
        alt.Chart(frame)
        .mark_line(strokeWidth=1.5)
        .encode(
            x=_time_axis(),
            y=alt.Y("per second:Q", title="req / s"),
            color=alt.Color(
                "series:N",
                scale=alt.Scale(domain=["requests", "rejected"], range=["#30638e", "#d1495b"]),
                # Beside the plot: Streamlit fits the whole chart, legend included, into its
                # height, and a legend below took all of it (a plot 0 px high).
                legend=alt.Legend(orient="right", title=None),
            ),
        )
        .properties(height=180)
    )


def traffic(rows: Sequence[Row], resolution_s: int) -> alt.Chart:
    """Admitted vs rejected per bucket, stacked."""
    frame = pd.DataFrame(
        {
            "time": [_time(r.bucket_s) for r in rows],
            "admitted": [r.admitted for r in rows],
            "rejected": [r.rejected for r in rows],
            "rejected (shadow)": [r.shadow_rejected for r in rows],
        }
    ).melt("time", var_name="outcome", value_name="requests")
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=_time_axis(),
            y=alt.Y("requests:Q", stack="zero", title=_unit(resolution_s)),
            color=alt.Color("outcome:N", scale=_COLORS, title=None),
            tooltip=[
                alt.Tooltip("time:T", format=TIME_FORMAT, title="time (UTC)"),
                "outcome:N",
                "requests:Q",
            ],
        )
        .properties(height=260)
    )


def _dense(seconds: Sequence[Second]) -> list[Second]:
    """Every second from the first to one past the last: a second without traffic is a zero
    (recorded traffic keeps only the seconds that had some), and the closing zero gives the
    last second its width in a step chart."""
    if not seconds:
        return []
    given = {s.second: s for s in seconds}
    first, last = seconds[0].second, seconds[-1].second
    return [given.get(t, Second(t, 0, 0)) for t in range(first, last + 2)]


def what_if(proposed: Replay, current: Replay | None, *, relative: bool = False) -> alt.Chart:
    """The proposal's admitted/rejected per second, stacked; the current rule's rejections
    as a line on top, both as steps: a second's count holds for that second only.
    ``relative``: the x axis is seconds from the start (synthetic traffic)."""
    start = proposed.seconds[0].second if proposed.seconds else 0

    def x(second: int) -> object:
        return second - start if relative else _time(second)

    frame = pd.DataFrame(
        [
            {"time": x(s.second), "outcome": outcome, "requests": count}
            for s in _dense(proposed.seconds)
            for outcome, count in (("admitted", s.admitted), ("rejected", s.rejected))
        ],
        columns=["time", "outcome", "requests"],
    )
    x_axis = alt.X("time:Q", title="seconds from start") if relative else _time_axis()
    layers = (
        alt.Chart(frame)
        .mark_area(interpolate="step-after", opacity=0.8)
        .encode(
            x=x_axis,
            y=alt.Y("requests:Q", stack="zero", title="requests / s"),
            color=alt.Color("outcome:N", scale=_COLORS, title="proposed"),
        )
    )
    if current is not None:
        now = pd.DataFrame(
            [{"time": x(s.second), "rejected now": s.rejected} for s in _dense(current.seconds)],
            columns=["time", "rejected now"],
        )
        line = (
            alt.Chart(now)
            .mark_line(color="black", strokeDash=[4, 3], strokeWidth=1.5, interpolate="step-after")
            .encode(x=x_axis, y=alt.Y("rejected now:Q", title="requests / s"))
        )
        layers = alt.layer(layers, line)
    return layers.properties(height=280)
