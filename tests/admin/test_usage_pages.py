"""Overview and Live usage from seeded telemetry; empty states; a database that is down."""

from __future__ import annotations

from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from sluice.clock import ManualClock
from sluice.policies.store import PolicyStore
from sluice.usage.store import UsageStore
from sluice_admin.charts import TIME_FORMAT
from tests.admin._harness import (
    ON_BOTH_DATABASES,
    charts,
    errors,
    metric,
    new_app,
    no_exceptions,
    open_page,
    sign_in,
)

NOW = 1_800_000_000  # the pages' clock (a ManualClock): nothing here depends on real time


def plotted(rows: list[dict[str, Any]], series: str, value: str) -> dict[tuple[int, str], int]:
    """A chart's rows as {(second, series): value}; each (second, series) plotted once."""
    points = {(int(r["time"].timestamp()), r[series]): r[value] for r in rows}
    assert len(points) == len(rows), rows
    return points


def seed(store: PolicyStore, *, ago_s: int = 3) -> None:
    """Telemetry ``ago_s`` seconds before ``NOW``."""
    second = NOW - ago_s
    UsageStore(store.database).add(
        # allowed, over_limit, shadow_over_limit, near_limit, backend_errors, blocked
        {("shop.user", second): [30, 10, 0, 4, 2, 0]},
        {("shop.user", second - second % 60): {"user,mallory": 9, "user,eve": 1}},
    )


def app() -> AppTest:
    return new_app(ManualClock(NOW))


@ON_BOTH_DATABASES
def test_overview_shows_rates_and_highlights_rules_over_their_limit(
    database_url: str, store: PolicyStore
) -> None:
    at = sign_in(app(), "ed")
    seed(store)
    at.run()
    no_exceptions(at)
    assert metric(at, "Requests / s") == "4.0"  # 40 requests over the last 10 s
    assert metric(at, "Rejected") == "25.0%"
    assert metric(at, "Backend errors (last 10 s)") == "2"
    assert errors(at) == ["Over limit: shop\\.user (10 rejected in 10 s)"]
    # The sparkline: each second of the last five minutes, a second without traffic a zero
    # (not a gap the line would bridge), all requests and the rejected ones.
    [sparkline] = charts(at)
    assert plotted(sparkline.rows(), "series", "per second") == {
        (t, series): count if t == NOW - 3 else 0
        for t in range(NOW - 300, NOW)
        for series, count in (("requests", 40), ("rejected", 10))
    }
    assert sparkline.spec["encoding"]["x"]["axis"]["format"] == TIME_FORMAT
    assert sparkline.spec["encoding"]["y"]["title"] == "req / s"


def test_overview_says_when_nothing_was_recorded(database_url: str) -> None:
    at = sign_in(app(), "ed")
    assert metric(at, "Requests / s") == "0.0"
    assert any("No usage recorded in the last 10 s" in c.value for c in at.caption)


@ON_BOTH_DATABASES
def test_live_usage_per_rule_with_top_offenders(database_url: str, store: PolicyStore) -> None:
    at = sign_in(app(), "ed")
    seed(store)
    at = open_page(at, "live")
    no_exceptions(at)
    assert "shop.user" in [t.value for t in at.text]
    assert (metric(at, "Admitted"), metric(at, "Rejected")) == ("30", "10")
    assert metric(at, "Rejection rate") == "25.0%"
    assert metric(at, "Near limit") == "4"
    # Each second of the five minutes up to now, stacked by outcome, quiet seconds as zeros.
    [traffic] = charts(at)
    assert plotted(traffic.rows(), "outcome", "requests") == {
        (t, outcome): count if t == NOW - 3 else 0
        for t in range(NOW - 300, NOW + 1)
        for outcome, count in (("admitted", 30), ("rejected", 10), ("rejected (shadow)", 0))
    }
    assert traffic.spec["encoding"]["y"]["title"] == "requests / s"
    [offenders] = at.dataframe
    assert offenders.value.to_dict("records") == [
        # the values only: the rule's name (shop.user) already says which key they are
        {"key": "mallory", "refused": 9},
        {"key": "eve", "refused": 1},
    ]


@ON_BOTH_DATABASES
def test_live_usage_marks_what_rlqs_data_planes_reported(
    database_url: str, store: PolicyStore
) -> None:
    at = sign_in(app(), "ed")
    second = NOW - 3
    UsageStore(store.database).add(
        {("shop.user (rlqs)", second): [50, 5, 0, 0, 0, 0]},
        {("shop.user (rlqs)", second - second % 60): {"user,mallory": 5}},
    )
    at = open_page(at, "live")
    no_exceptions(at)
    assert "shop.user (rlqs)" in [t.value for t in at.text]
    assert any("Reported over RLQS" in c.value for c in at.caption)
    assert (metric(at, "Admitted"), metric(at, "Rejected")) == ("50", "5")


@pytest.mark.parametrize("label", ["1 h", "24 h"])
@ON_BOTH_DATABASES
def test_longer_ranges_read_per_minute_figures(
    database_url: str, store: PolicyStore, label: str
) -> None:
    seed(store, ago_s=120)
    at = open_page(sign_in(app(), "ed"), "live")
    assert not any("No usage recorded" in i.value for i in at.info)
    at.button_group(key="live_range").set_value(label).run()
    no_exceptions(at)
    assert metric(at, "Rejected") == "10"
    assert any("per-minute" in c.value for c in at.caption)


def test_live_usage_empty_state(database_url: str) -> None:
    at = open_page(sign_in(app(), "ed"), "live")
    assert any("No usage recorded in the last 5 min" in i.value for i in at.info)


def test_a_database_that_is_down_is_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 1 on loopback: the connection is refused at once.
    monkeypatch.setenv("SLUICE_DATABASE_URL", "postgresql://sluice:pw@127.0.0.1:1/sluice")
    at = new_app()
    at.run()
    at.text_input(key="sign_in_name").input("ed")
    at.text_input(key="sign_in_password").input("whatever")
    at.button(key="FormSubmitter:sign_in-Sign in").click().run()
    no_exceptions(at)
    [message] = errors(at)
    assert message.startswith("The config database cannot be reached")
    assert "pw" not in message.replace("postgresql", "")  # the password is redacted
