"""Driving the admin app in-process with Streamlit's AppTest, against a SQLite database (or,
for the tests marked ``ON_BOTH_DATABASES``, a PostgreSQL one too)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from streamlit.testing.v1 import AppTest

from sluice.clock import Clock
from sluice_admin import APP_PATH
from sluice_admin.session import CLOCK

PASSWORD = "correct horse battery"
PAGES = ("overview", "rules", "live", "what_if", "history", "transfer")

# The test runs twice: on SQLite, and on a PostgreSQL database of its own (as docker-compose
# runs the app), for the paths whose SQL differs by dialect or that only PostgreSQL may
# refuse (accounts, sign-in, the usage queries). Needs the ``database_url`` fixture.
ON_BOTH_DATABASES = pytest.mark.parametrize("database_url", ["sqlite", "postgresql"], indirect=True)


class CheckedAppTest(AppTest):
    """An AppTest whose every run, however started (``at.run()``, ``button.click().run()``),
    fails the test if the page raised: a page that raises shows a traceback instead of its
    content, and a test looking for something else on it could still pass."""

    def _run(self, widget_state: Any = None, timeout: float | None = None) -> AppTest:
        result = super()._run(widget_state, timeout)
        assert not self.exception, [e.value for e in self.exception]
        return result


def new_app(clock: Clock | None = None) -> AppTest:
    """The app, its pages reading ``clock`` (a ManualClock: figures seeded at fixed instants
    stay in the pages' windows however long the runs take) or, without one, the system's."""
    # Generous: the first run in a process imports pandas and altair.
    at = CheckedAppTest(APP_PATH, default_timeout=30)
    if clock is not None:
        at.session_state[CLOCK] = clock
    return at


def sign_in(at: AppTest, name: str, password: str = PASSWORD) -> AppTest:
    at.run()
    at.text_input(key="sign_in_name").input(name)
    at.text_input(key="sign_in_password").input(password)
    at.button(key="FormSubmitter:sign_in-Sign in").click()
    return at.run()


def open_page(at: AppTest, page: str) -> AppTest:
    at.switch_page(f"views/{page}.py")
    return at.run()


def texts(at: AppTest) -> list[str]:
    return [t.value for t in at.text]


def codes(at: AppTest) -> list[str]:
    return [c.value for c in at.code]


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


def metric(at: AppTest, label: str) -> str:
    values = [m.value for m in at.metric if m.label == label]
    assert values, f"no metric {label!r} among {[m.label for m in at.metric]}"
    return values[0]


def no_exceptions(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


@dataclass(frozen=True)
class Chart:
    """A chart as the page sent it to the browser: its Vega-Lite spec, and the rows of each of
    its datasets (what it plots), by name."""

    spec: dict[str, Any]
    datasets: dict[str, list[dict[str, Any]]]

    def rows(self, layer: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """The rows the chart (or one of its layers) plots."""
        return self.datasets[(layer or self.spec)["data"]["name"]]


def charts(at: AppTest) -> list[Chart]:
    """Every Altair chart on the page, in order."""
    found = []
    for element in at.get("arrow_vega_lite_chart") + at.get("vega_lite_chart"):
        proto = element.proto
        datasets = {
            named.name: convert_arrow_bytes_to_pandas_df(named.data.data).to_dict("records")
            for named in proto.datasets
        }
        found.append(Chart(json.loads(proto.spec), datasets))
    return found
