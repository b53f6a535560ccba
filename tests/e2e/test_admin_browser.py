"""The admin app in a real browser, against a real server sharing its config database.

Sign in, add a rule with the form, publish it, watch gRPC traffic get refused within 2 s,
see the refusals on the Live usage page, roll back from History, and render the What-if
chart. Screenshots of every page land in docs/screenshots/ (used by the README).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from playwright import sync_api as playwright

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import load_text
from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS, Outbound, run_admin, submit_sign_in
from tests.e2e.browser import settle as browser_settle
from tests.support.processes import sluice_serve, wait_until

pytestmark = pytest.mark.e2e


# Screenshots go to the test's tmp dir; SLUICE_UPDATE_SCREENSHOTS=1 refreshes the committed set
# in docs/screenshots/ (used by the README), so a plain test run leaves the checkout clean.
DOC_SCREENSHOTS = Path(__file__).parents[2] / "docs" / "screenshots"
OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT


@pytest.fixture
def admin_app(tmp_path: Path, database_url: str) -> Iterator[str]:
    with run_admin(tmp_path, database_url) as url:
        yield url


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'sluice.db'}"
    with PolicyStore(url) as store:
        store.upgrade()
        [policy] = load_text("domain: shop\ndescriptors:\n  - key: path\n    value: /health\n")
        PolicyService(store).publish([policy], author="seed", comment="health checks unlimited")
    return url


def _decide(stub: rls_pb2_grpc.RateLimitServiceStub, user: str) -> int:
    entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=user)
    request = rls_pb2.RateLimitRequest(
        domain="shop", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
    )
    return stub.ShouldRateLimit(request, timeout=2).overall_code


def _until(predicate, timeout_s: float, what: str) -> float:  # noqa: ANN001
    """Seconds it took ``predicate`` to hold."""
    start = time.monotonic()
    wait_until(predicate, timeout_s, what, interval_s=0.05)
    return time.monotonic() - start


@pytest.mark.slow
def test_publish_watch_roll_back_in_a_browser(
    tmp_path: Path, database_url: str, admin_app: str
) -> None:
    DOC_SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    extra = ["--usage-flush-interval-s", "0.2"]
    with (
        sluice_serve(tmp_path, database_url=database_url, extra_args=extra) as server,
        grpc.insecure_channel(server.grpc_target) as channel,
        playwright.sync_playwright() as p,
    ):
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        assert _decide(stub, "alice") == OK  # no limit for users yet
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1280, "height": 800})
        outbound = Outbound(admin_app)
        context.route("**/*", outbound.route)
        page = context.new_page()
        page.set_default_timeout(30_000)  # two test workers share the CPUs

        def settle() -> None:
            browser_settle(page)

        def nav(title: str) -> None:
            # The sidebar links keep the session (a new URL would start a new one).
            page.get_by_role("link", name=title, exact=True).click()
            page.get_by_role("heading", name=title, exact=True).wait_for()
            settle()

        def shot(name: str) -> None:
            page.wait_for_timeout(300)  # let charts finish drawing
            target = DOC_SCREENSHOTS if os.environ.get("SLUICE_UPDATE_SCREENSHOTS") else tmp_path
            page.screenshot(path=str(target / f"{name}.png"))

        # Sign in.
        page.goto(admin_app)
        page.get_by_label("User name").fill("ed")
        shot("sign_in")
        submit_sign_in(page)
        page.get_by_role("heading", name="Overview").wait_for()

        # Add a rule: 2 per hour per user (an hour: no window edge within the test).
        nav("Rules")
        page.get_by_role("button", name="Add rule").click()
        form = page.locator('[data-testid="stForm"]')
        form.get_by_label("Key").fill("user")
        rpu = form.get_by_label("Requests per unit").first
        rpu.fill("2")
        rpu.press("Tab")
        unit = form.get_by_role("combobox", name="Unit").first
        unit.click()
        page.get_by_role("option", name="hour", exact=True).click()
        wait_until(lambda: unit.input_value() == "hour", 5, "the unit to be chosen")
        settle()
        form.get_by_role("button", name="Apply to pending change").click()
        page.get_by_text("shop.user: 2 / hour").wait_for()
        shot("rules")
        page.get_by_role("tab", name="Pending change").click()
        page.get_by_label("Comment").fill("2 per hour per user")
        page.get_by_label("Comment").press("Tab")
        settle()
        page.get_by_role("button", name="Publish").click()
        page.get_by_text("Published version 2 of shop.").wait_for()
        published = time.monotonic()

        # Live within 2 s: the third request of a user in the hour is refused.
        def refused() -> bool:
            return _decide(stub, "bob") == OVER

        _until(refused, 2.0, "the published limit to refuse traffic")
        assert time.monotonic() - published < 2.0
        for _ in range(5):
            _decide(stub, "mallory")

        # The refusals show on the Live usage page (it refreshes by itself).
        nav("Live usage")
        rejected = (
            page.locator('[data-testid="stMetric"]')
            .filter(has_text="Rejected")
            .first.locator('[data-testid="stMetricValue"]')
        )
        wait_until(
            lambda: int(rejected.inner_text() or 0) > 0, 10, "rejections on the live page", 0.2
        )
        page.get_by_text("shop.user", exact=True).wait_for()
        shot("live")

        nav("Overview")
        page.locator('[data-testid="stVegaLiteChart"] >> visible=true').first.wait_for()
        shot("overview")

        # What-if: the chart renders for the new rule's recorded traffic.
        nav("What-if")
        chart = page.locator('[data-testid="stVegaLiteChart"] >> visible=true').first
        chart.wait_for()
        chart.scroll_into_view_if_needed()
        # The server recorded its traffic per key: replayed per key, not as one counter.
        page.get_by_text(re.compile("Replayed per key, as the server decides")).first.wait_for()
        assert page.get_by_text(re.compile("one counter")).count() == 0
        shot("what_if")

        nav("Import / export")
        shot("transfer")

        # Roll back to version 1 (no user limit), after confirming.
        nav("History")
        page.get_by_role("button", name="Roll back to v1").click()
        page.get_by_text("Roll back shop to version 1?").wait_for()
        shot("history")
        settle()
        page.get_by_role("button", name="Yes, roll back").click()
        page.get_by_text("Version 3 restores version 1.").wait_for()
        _until(lambda: _decide(stub, "bob") == OK, 2.0, "the rollback to take effect")
        assert outbound.refused == []  # no host but the admin app, on any page
        browser.close()
