"""The admin app's pages in a real browser, from seeded telemetry: what only a browser shows.

Every test routes the browser's requests and refuses any to a host but the admin app (the
app must work offline and leak nothing); the charts are measured in pixels, the layout in
the page's own geometry.
"""

from __future__ import annotations

import io
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from playwright import sync_api as playwright

from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import dump_policies, load_text
from sluice.usage.store import UsageStore
from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS, Outbound, run_admin, settle, sign_in

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

RULE = """\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: %d}
"""
REQUESTS_BLUE = (0x30, 0x63, 0x8E)  # the sparkline's "requests" line (charts.sparkline)
PAGES = ["Overview", "Rules", "Live usage", "What-if", "History", "Import / export"]


@pytest.fixture(scope="module")
def database_url(tmp_path_factory: pytest.TempPathFactory) -> str:
    """Domain ``shop`` with one rule, published eight times (a history longer than a screen),
    and five minutes of telemetry for it up to now, with a quiet minute in the middle."""
    url = f"sqlite:///{tmp_path_factory.mktemp('admin-pages') / 'sluice.db'}"
    with PolicyStore(url) as store:
        store.upgrade()
        service = PolicyService(store)
        for version in range(1, 9):
            service.publish(load_text(RULE % (version * 5)), author="seed", comment=f"v{version}")
        now = int(time.time())
        # ... and on past now for as long as the module's tests may take: the pages read real
        # time, and the Overview's "over limit" looks at the last 10 s whenever it is opened.
        counts = {
            ("shop.user", now - 300 + i): [5 + i % 20, i % 7, 0, 0, 0, 0]
            for i in range(300 + 600)
            if not 120 <= i < 180
        }
        offenders = {("shop.user", now - now % 60): {"user,mallory": 9}}
        UsageStore(store.database).add(counts, offenders)
    return url


@dataclass
class Browser:
    page: Any
    outbound: Outbound

    def nav(self, title: str) -> None:
        # The sidebar links keep the session (a new URL would start a new one).
        self.page.get_by_role("link", name=title, exact=True).click()
        self.page.get_by_role("heading", name=title, exact=True).wait_for()
        settle(self.page)


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory, database_url: str) -> Iterator[Browser]:
    """One signed-in browser for the module (starting the app and Chromium is most of each
    test's time); each test navigates to the page it looks at, the one that changes data
    (rollback) last."""
    with (
        run_admin(tmp_path_factory.mktemp("admin-run"), database_url) as url,
        playwright.sync_playwright() as p,
    ):
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = chromium.new_context(viewport={"width": 1400, "height": 900})
        outbound = Outbound(url)
        context.route("**/*", outbound.route)
        page = context.new_page()
        page.set_default_timeout(30_000)  # two test workers share the CPUs
        sign_in(page, url)
        settle(page)
        yield Browser(page, outbound)
        chromium.close()


def test_every_page_names_the_rule_alike_and_asks_no_other_host(browser: Browser) -> None:
    page = browser.page
    page.get_by_text("Over limit: shop.user", exact=False).wait_for()
    names: dict[str, list[str]] = {}
    for title in PAGES[1:]:
        browser.nav(title)
        if title in ("Rules", "Live usage"):  # the tree row; the rule's panel
            names[title] = page.get_by_text("shop.user", exact=False).all_inner_texts()
        if title == "What-if":  # the rule chosen to try limits on
            chosen = page.locator('[data-testid="stSelectbox"]').filter(has_text="Rule")
            names[title] = [chosen.locator("input").input_value()]
    browser.nav("Overview")
    # Every page's favicon came from fonts.gstatic.com (35 console errors offline).
    assert browser.outbound.refused == []
    assert names == {
        "Rules": ["shop.user: 40 / second"],  # it was "user" here and "shop.user" there
        "Live usage": ["shop.user"],
        "What-if": ["shop.user"],
    }


def _extent_px(png: bytes, color: tuple[int, int, int], tolerance: int = 40) -> int:
    """How many pixel rows of the image hold ``color``: the height a line spans."""
    image = Image.open(io.BytesIO(png)).convert("RGB")
    width, height = image.size
    pixels = image.load()
    assert pixels is not None
    rows = [
        y
        for y in range(height)
        if any(
            sum(abs(a - b) for a, b in zip(pixels[x, y], color, strict=True)) <= tolerance
            for x in range(width)
        )
    ]
    return rows[-1] - rows[0] + 1 if rows else 0


def test_the_overview_sparkline_has_a_plot_to_draw_in(browser: Browser) -> None:
    browser.nav("Overview")
    chart = browser.page.locator('[data-testid="stVegaLiteChart"] >> visible=true').first
    chart.wait_for()
    browser.page.wait_for_timeout(500)  # let Vega finish drawing
    box = chart.bounding_box()
    assert box is not None
    # Requests vary from 5 to 24 per second and drop to 0 for a minute: the line spans most
    # of the plot's height (it was a flat line in a plot 0 px high).
    assert _extent_px(chart.screenshot(), REQUESTS_BLUE) >= 80, box
    assert browser.outbound.refused == []


def test_duplicate_is_not_cut_short_at_1400_px(browser: Browser) -> None:
    browser.nav("Rules")
    button = browser.page.get_by_role("button", name="Duplicate", exact=True)
    clipped = button.evaluate(
        "b => [b, ...b.querySelectorAll('*')].some(e => e.scrollWidth > e.clientWidth + 1)"
    )
    assert not clipped  # it read "Dupli…"


def test_the_download_is_the_published_policy_and_imports_back_unchanged(
    browser: Browser, database_url: str, tmp_path: Path
) -> None:
    page = browser.page
    browser.nav("Import / export")
    with page.expect_download() as download:
        page.get_by_role("button", name="Download YAML").click()
    assert download.value.suggested_filename == "ratelimit.yaml"
    saved = tmp_path / "ratelimit.yaml"
    download.value.save_as(saved)
    with PolicyStore(database_url) as store:
        published = PolicyService(store).get("shop")
    # The bytes are the published version's YAML, which the loader reads back as that policy.
    assert saved.read_bytes() == dump_policies([published.policy]).encode()
    assert load_text(saved.read_text()) == [published.policy]
    # Imported again, it changes nothing: no new version.
    page.locator('[data-testid="stFileUploaderDropzoneInput"]').set_input_files(saved)
    page.get_by_text("Valid: shop (1 rules)", exact=True).wait_for()
    settle(page)
    page.get_by_role("button", name="Import", exact=True).click()
    page.get_by_text("Imported: no changes.", exact=True).wait_for()
    with PolicyStore(database_url) as store:
        assert PolicyService(store).get("shop").version == published.version == 8
    assert browser.outbound.refused == []


def test_the_rollback_confirmation_opens_beside_its_button(browser: Browser) -> None:
    page = browser.page
    browser.nav("History")
    button = page.get_by_role("button", name="Roll back to v1", exact=True)
    button.scroll_into_view_if_needed()
    clicked_at = button.bounding_box()
    assert clicked_at is not None
    button.click()
    question = page.get_by_text("Roll back shop to version 1?", exact=False)
    question.wait_for()
    settle(page)
    # Where the button was, without scrolling: on screen and next to where it was clicked.
    where = question.bounding_box()
    assert where is not None
    assert 0 <= where["y"] <= 900 - where["height"], where
    assert abs(where["y"] - clicked_at["y"]) < 200, (where, clicked_at)
    # The diff it would publish (v8's 40/s back to v1's 5/s) and a comment.
    diff = page.locator("code").filter(has_text="--- shop@v8")
    assert diff.is_visible()
    lines = diff.inner_text().splitlines()
    assert "-    requests_per_unit: 40" in lines and "+    requests_per_unit: 5" in lines
    comment = page.get_by_label("Comment")
    comment.fill("40/s let a scraper through")
    comment.press("Tab")
    settle(page)
    page.get_by_role("button", name="Yes, roll back").click()
    page.get_by_text("Version 9 restores version 1.").wait_for()
    page.get_by_text("Comment: 40/s let a scraper through").wait_for()
    assert browser.outbound.refused == []
