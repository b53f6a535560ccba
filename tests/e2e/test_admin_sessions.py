"""Admin sessions in a real browser: what a reload, a bookmark, a second browser and a coffee
break do to them.

- a reload keeps the session, and the cookie holding it is HttpOnly and SameSite=Strict;
- a deep link opens its page, signed in already or after the sign-in it asks for;
- signing out in one browser ends the session in another (separate cookie jars);
- a session idle longer than ``--admin-session-idle-timeout-s`` ends, and activity keeps it;
- pending edits survive a reload;
- the route that sets the cookie takes a sign-in ticket once, from the app only.

Each test routes the browser's requests and refuses any host but the admin app.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playwright import sync_api as playwright

from sluice.policies.service import PolicyService
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import load_text
from sluice_admin.auth import Role, User
from sluice_admin.data import AdminData
from tests.e2e.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    Outbound,
    run_admin,
    settle,
    sign_in,
    submit_sign_in,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

COOKIE = "sluice_admin_session"
LIFETIME_S = 43200  # the default --admin-session-lifetime-s
IDLE_S = 6.0


@pytest.fixture
def database_url(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'sluice.db'}"
    with PolicyStore(url) as store:
        store.upgrade()
        [policy] = load_text(
            "domain: shop\ndescriptors:\n  - key: user\n"
            "    rate_limit: {unit: minute, requests_per_unit: 5}\n"
        )
        PolicyService(store).publish([policy], author="seed", comment="first")
    return url


@pytest.fixture
def chromium() -> Iterator[Any]:
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


def new_page(chromium: Any, url: str) -> tuple[Any, Outbound]:
    """A page in a browser context of its own: its own cookie jar, as another browser."""
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    outbound = Outbound(url)
    context.route("**/*", outbound.route)
    page = context.new_page()
    page.set_default_timeout(30_000)  # other test workers share the CPUs
    return page, outbound


def heading(page: Any, title: str) -> None:
    page.get_by_role("heading", name=title, exact=True).wait_for()
    settle(page)


def nav(page: Any, title: str) -> None:
    page.get_by_role("link", name=title, exact=True).click()
    heading(page, title)


def signed_out(page: Any) -> None:
    page.get_by_role("button", name="Sign in").wait_for()
    settle(page)
    assert page.get_by_text("Signed in as").count() == 0


def test_a_reload_keeps_the_session_in_an_http_only_cookie(
    tmp_path: Path, database_url: str, chromium: Any
) -> None:
    with run_admin(tmp_path, database_url) as url:
        page, outbound = new_page(chromium, url)
        sign_in(page, url)
        nav(page, "Rules")
        page.reload()
        heading(page, "Rules")
        page.get_by_text("Signed in as ed (editor)").wait_for()
        page.get_by_text("shop.user: 5 / minute").wait_for()

        [cookie] = [c for c in page.context.cookies() if c["name"] == COOKIE]
        assert (cookie["httpOnly"], cookie["sameSite"], cookie["path"]) == (True, "Strict", "/")
        assert not cookie["secure"]  # served over plain HTTP here; Secure over HTTPS
        assert abs(cookie["expires"] - (time.time() + LIFETIME_S)) < 120
        assert COOKIE not in page.evaluate("document.cookie")  # script cannot read it
        assert outbound.refused == []


def test_a_deep_link_opens_its_page_before_and_after_sign_in(
    tmp_path: Path, database_url: str, chromium: Any
) -> None:
    with run_admin(tmp_path, database_url) as url:
        page, _ = new_page(chromium, url)
        page.goto(f"{url}/history")  # a bookmark, before signing in: the gate first
        submit_sign_in(page)
        heading(page, "History")  # ... then the page it asked for
        assert page.url == f"{url}/history"

        page.goto(f"{url}/rules")  # signed in: straight there
        heading(page, "Rules")
        page.get_by_text("shop.user: 5 / minute").wait_for()


def test_signing_out_ends_the_session_in_another_browser(
    tmp_path: Path, database_url: str, chromium: Any
) -> None:
    with run_admin(tmp_path, database_url) as url:
        laptop, _ = new_page(chromium, url)
        desktop, _ = new_page(chromium, url)
        wall, _ = new_page(chromium, url)  # left on the Overview, which refreshes itself
        for page in (laptop, desktop, wall):
            sign_in(page, url)
        nav(desktop, "Rules")

        laptop.get_by_role("button", name="Sign out").click()
        signed_out(laptop)
        assert [c for c in laptop.context.cookies() if c["name"] == COOKIE] == []

        # The wall screen, untouched, turns to the sign-in page by itself.
        signed_out(wall)
        # The desktop's page is still open: its next action finds the session ended.
        desktop.get_by_role("link", name="History", exact=True).click()
        signed_out(desktop)
        desktop.get_by_text("You were signed out (here or in another tab or browser).").wait_for()
        assert desktop.get_by_role("heading", name="History").count() == 0
        desktop.reload()  # its cookie names an ended session
        signed_out(desktop)
        desktop.goto(f"{url}/rules")
        signed_out(desktop)
        assert desktop.get_by_text("shop.user").count() == 0


def test_an_idle_session_ends_and_activity_keeps_it(
    tmp_path: Path, database_url: str, chromium: Any
) -> None:
    extra = ["--admin-session-idle-timeout-s", str(IDLE_S)]
    with run_admin(tmp_path, database_url, extra) as url:
        page, _ = new_page(chromium, url)
        sign_in(page, url)
        signed_in_at = time.monotonic()
        # Busy for twice the timeout, never idle for half of it: still signed in.
        for title in ["Rules", "History"] * 4:
            before = time.monotonic()
            nav(page, title)
            assert time.monotonic() - before < IDLE_S / 2, "too slow to say anything"
            page.wait_for_timeout(IDLE_S / 4 * 1000)
        assert time.monotonic() - signed_in_at > 2 * IDLE_S
        page.get_by_text("Signed in as ed (editor)").wait_for()

        # Idle past the timeout (the History page does not refresh itself): the next click
        # shows the sign-in page.
        last_action = time.monotonic()
        page.wait_for_timeout((IDLE_S + 1) * 1000)
        assert time.monotonic() - last_action > IDLE_S
        page.get_by_role("link", name="Rules", exact=True).click()
        signed_out(page)
        page.get_by_text("You were signed out after 6 seconds without activity.").wait_for()
        # Signing in again (the cookie still names the ended session) goes back to that page.
        submit_sign_in(page)
        heading(page, "Rules")


def test_pending_edits_survive_a_reload(tmp_path: Path, database_url: str, chromium: Any) -> None:
    with run_admin(tmp_path, database_url) as url:
        page, _ = new_page(chromium, url)
        sign_in(page, url)
        nav(page, "Rules")
        page.get_by_role("button", name="Edit").first.click()
        form = page.locator('[data-testid="stForm"]')
        rpu = form.get_by_label("Requests per unit").first
        rpu.fill("7")
        rpu.press("Tab")
        settle(page)
        form.get_by_role("button", name="Apply to pending change").click()
        page.get_by_text("shop.user: 7 / minute").wait_for()

        page.reload()
        heading(page, "Rules")
        page.get_by_text("shop.user: 7 / minute").wait_for()
        page.get_by_text("unpublished changes").wait_for()
        page.get_by_role("tab", name="Pending change").click()
        page.get_by_role("button", name="Publish").wait_for()  # shown only with a diff


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # hand the 303 back as it is


def _get(url: str, headers: dict[str, str]) -> tuple[int, str, str | None]:
    """Status, Location and Set-Cookie of one GET, redirects not followed."""
    opener = urllib.request.build_opener(_NoRedirects)
    try:
        response = opener.open(urllib.request.Request(url, headers=headers), timeout=10)
    except urllib.error.HTTPError as exc:
        response = exc
    return response.status, response.headers.get("location", ""), response.headers["set-cookie"]


def test_the_cookie_route_takes_a_ticket_once_and_only_from_the_app(
    tmp_path: Path, database_url: str
) -> None:
    with run_admin(tmp_path, database_url) as url:
        data = AdminData.open(database_url)
        try:
            _, ticket = data.sessions.start(
                User("ed", Role.EDITOR), now_s=time.time(), lifetime_s=60
            )
        finally:
            data.close()
        route = f"{url}/_sluice/session?ticket={ticket}&next="
        # A link on another site: refused, and the ticket is not spent.
        assert _get(route + "/rules", {"Sec-Fetch-Site": "cross-site"})[::2] == (403, None)
        # From the app: the cookie, and on to a path of the app only (not //evil.example).
        status, location, cookie = _get(route + "//evil.example/", {"Sec-Fetch-Site": "none"})
        assert (status, location) == (303, "/")
        assert cookie is not None and cookie.startswith(f"{COOKIE}=")
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Max-Age=" in cookie
        # Once only.
        assert _get(route + "/rules", {"Sec-Fetch-Site": "same-origin"}) == (303, "/", None)
        # Another site cannot drop the cookie either.
        assert _get(f"{url}/_sluice/sign-out", {"Sec-Fetch-Site": "cross-site"})[::2] == (
            403,
            None,
        )
