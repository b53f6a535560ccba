"""A suggested limit, from recorded per-key usage, turned into a pending edit in a real browser."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from playwright import sync_api as playwright

from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import load_text
from sluice.usage.key_summary import KeySummary
from sluice.usage.store import UsageStore
from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS, Outbound, run_admin, settle, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RULE = """\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 500}
"""


def test_a_suggested_limit_becomes_a_pending_edit(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'sluice.db'}"
    with PolicyStore(url) as store:
        store.upgrade()
        PolicyService(store).publish(load_text(RULE), author="seed", comment="first")
        # The last two minutes: 'scraper' at 40/s, 'alice' at 9/s, 18 others at 1/s (the
        # pages read the real clock).
        now = int(time.time())
        seconds = range(now - 120, now)
        UsageStore(store.database).add(
            {("shop.user", s): [67, 0, 0, 0, 0, 0] for s in seconds},
            {},
            {
                ("shop.user", s): KeySummary({"user,scraper": 40, "user,alice": 9}, {1: [18, 18]})
                for s in seconds
            },
        )
    with (
        run_admin(tmp_path, url) as admin,
        playwright.sync_playwright() as p,
    ):
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = chromium.new_context(viewport={"width": 1400, "height": 900})
        outbound = Outbound(admin)
        context.route("**/*", outbound.route)
        page = context.new_page()
        page.set_default_timeout(30_000)
        sign_in(page, admin)
        settle(page)
        page.get_by_role("link", name="What-if", exact=True).click()
        page.get_by_role("heading", name="What-if", exact=True).wait_for()
        settle(page)
        page.get_by_role("tab", name="Suggested limit").click()
        top = page.get_by_label("Refuse the top % of keys")
        top.fill("5")  # of 20 keys, one: the scraper
        top.press("Enter")
        settle(page)
        suggestion = page.locator('[data-testid="stMetric"]').filter(
            has_text="Suggested limit (requests / second)"
        )
        # Waited for: the rerun that the new share starts may not have begun yet.
        playwright.expect(suggestion.locator('[data-testid="stMetricValue"]')).to_have_text("9")
        settle(page)
        page.get_by_role("button", name="Make it a pending edit").click()
        page.get_by_text("9 / second is now a pending edit", exact=False).wait_for()

        page.get_by_role("link", name="Rules", exact=True).click()
        page.get_by_role("heading", name="Rules", exact=True).wait_for()
        settle(page)
        page.get_by_role("tab", name="Pending change").click()
        diff = page.locator("code").filter(has_text="--- shop@v1")
        diff.wait_for()
        lines = diff.inner_text().splitlines()
        assert "-    unit: minute" in lines and "+    unit: second" in lines
        assert "-    requests_per_unit: 500" in lines and "+    requests_per_unit: 9" in lines
        assert outbound.refused == []
        chromium.close()
