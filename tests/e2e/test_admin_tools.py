"""The admin app's policy tools and Users page in a real browser, against a real server on
the same config database: each change checked by what ``sluice serve`` answers afterwards
(or, for users, by who can sign in).

One server, one app and one signed-in admin for the module; each test uses its own user
values, so their counters do not meet.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from playwright import sync_api as playwright

from sluice._proto.envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice.policies.service import DomainView, PolicyService, Version
from sluice.policies.store import PolicyStore
from sluice.policies.yaml_format import load_text
from sluice_admin.auth import Account, Role, hash_password
from sluice_admin.data import AdminData
from tests.e2e.browser import CHROMIUM, CHROMIUM_ARGS, PASSWORD, Outbound, run_admin, settle
from tests.e2e.browser import sign_in as browser_sign_in
from tests.support.processes import sluice_serve, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

OK, OVER = rls_pb2.RateLimitResponse.OK, rls_pb2.RateLimitResponse.OVER_LIMIT
# Two per hour per user: no window edge within the test, and a third request is refused.
POLICY = """\
domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
"""
ZOE_FIRST, ZOE_SECOND = "zoe's first password", "zoe's second password"
DOC_SCREENSHOTS = Path(__file__).parents[2] / "docs" / "screenshots"
TTL_S = 12  # the override's: long enough to see it applied on a loaded machine


@dataclass
class Env:
    url: str
    database_url: str
    stub: rls_pb2_grpc.RateLimitServiceStub
    browser: Any
    page: Any
    outbound: Outbound
    shots: Path  # where screenshots go
    server_http: str  # the server's HTTP port, for /status

    def shot(self, name: str) -> None:
        """The page from its title down (Streamlit scrolls its own container, not the page)."""
        self.page.locator("h1").first.scroll_into_view_if_needed()
        self.page.screenshot(path=str(self.shots / f"{name}.png"))

    def decide(self, user: str) -> int:
        entry = ratelimit_pb2.RateLimitDescriptor.Entry(key="user", value=user)
        request = rls_pb2.RateLimitRequest(
            domain="shop", descriptors=[ratelimit_pb2.RateLimitDescriptor(entries=[entry])]
        )
        return self.stub.ShouldRateLimit(request, timeout=2).overall_code

    def until(self, user: str, code: int, what: str, timeout_s: float = 10.0) -> None:
        """Until the server answers ``code`` for ``user`` (a change reaches it with its next
        poll of the config database, every 0.25 s). Only for asks that spend nothing
        until the change arrives (refused ones). The wait is generous: this file tests that
        the page's change reaches the server, not how fast; test_policy_lifecycle times
        propagation against the machine's measured pace."""
        wait_until(lambda: self.decide(user) == code, timeout_s, what, interval_s=0.05)

    def serving_live_version(self, what: str) -> None:
        """Until the server serves the domain's live version (its /status says so): a wait
        that sends no decision, so it spends no one's limit."""
        wanted = f"shop@v{self.live().version}"

        def serving() -> bool:
            with urllib.request.urlopen(self.server_http + "/status", timeout=5) as response:
                return bool(json.loads(response.read())["config"]["version"] == wanted)

        wait_until(serving, 10, what, interval_s=0.05)

    def nav(self, title: str) -> None:
        self.page.get_by_role("link", name=title, exact=True).click()
        self.page.get_by_role("heading", name=title, exact=True).wait_for()
        settle(self.page)

    def click(self, button: str) -> None:
        """Click the button once the rerun after the last input has replaced the page's
        elements (until then a faded old copy of the button may be on it too)."""
        found = self.page.get_by_role("button", name=button, exact=True)
        wait_until(lambda: found.count() == 1, 10, f"one '{button}' button")
        found.click()

    def form(self, button: str) -> Any:
        """The visible form whose submit button says ``button``."""
        return self.page.locator('[data-testid="stForm"] >> visible=true').filter(
            has=self.page.get_by_role("button", name=button, exact=True)
        )

    def live(self) -> DomainView:
        with PolicyStore(self.database_url) as store:
            return PolicyService(store).get("shop")

    def history(self) -> list[Version]:
        with PolicyStore(self.database_url) as store:
            return PolicyService(store).history("shop")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    workdir = tmp_path_factory.mktemp("admin-tools")
    database_url = f"sqlite:///{workdir / 'sluice.db'}"
    with PolicyStore(database_url) as store:
        store.upgrade()
        PolicyService(store).publish(load_text(POLICY), author="seed", comment="2/h per user")
    data = AdminData.open(database_url)
    data.save_account(Account("ada", Role.ADMIN, hash_password(PASSWORD)), actor="seed")
    data.close()
    extra = ["--usage-flush-interval-s", "0.2"]
    with (
        sluice_serve(workdir, database_url=database_url, extra_args=extra) as server,
        grpc.insecure_channel(server.grpc_target) as channel,
        run_admin(workdir, database_url) as url,
        playwright.sync_playwright() as p,
    ):
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        context = chromium.new_context(viewport={"width": 1400, "height": 900})
        outbound = Outbound(url)
        context.route("**/*", outbound.route)
        page = context.new_page()
        page.set_default_timeout(30_000)  # other test workers share the CPUs
        browser_sign_in(page, url, "ada")
        settle(page)
        # SLUICE_UPDATE_SCREENSHOTS=1 refreshes the committed ones (README, docs/admin.md).
        shots = DOC_SCREENSHOTS if os.environ.get("SLUICE_UPDATE_SCREENSHOTS") else workdir
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)
        yield Env(url, database_url, stub, chromium, page, outbound, shots, server.http_url)
        assert outbound.refused == []  # no host but the admin app, on any page
        chromium.close()


def _signs_in(env: Env, name: str, password: str) -> Any:
    """A fresh browser's page after signing in as ``name``: signed in, or the form's error."""
    context = env.browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(env.url)
    # A sign-in ends with a navigation (to the route that sets the session cookie, then back):
    # noted as it happens, so a signed-in page is used only once it is over.
    navigated: list[str] = []
    page.on("framenavigated", lambda f: navigated.append(f.url) if f == page.main_frame else None)
    page.get_by_label("User name").fill(name)
    page.get_by_role("textbox", name="Password").fill(password)
    page.get_by_role("button", name="Sign in").click()
    overview = page.get_by_role("heading", name="Overview")
    page.get_by_text("Wrong user name or password.").or_(overview).wait_for()
    if overview.count():
        if not navigated:
            page.wait_for_event("framenavigated", lambda f: f == page.main_frame)
        overview.wait_for()
        settle(page)
    return page


def _choose(page: Any, combobox: Any, option: str) -> None:
    """Pick ``option`` in a select box, typing it (a click on a focused box may close it)."""
    combobox.click()
    page.keyboard.type(option)  # into the focused box (open, it is named differently)
    page.get_by_role("option", name=option, exact=True).click()
    wait_until(lambda: combobox.input_value() == option, 5, f"{option} to be chosen")
    settle(page)


def _users_change(env: Env, name: str) -> None:
    _choose(env.page, env.page.get_by_role("combobox", name="User", exact=True), name)


def test_users_page(env: Env) -> None:
    page = env.page
    env.nav("Users")
    # The last admin cannot demote themselves.
    _users_change(env, "ada")
    _choose(page, page.get_by_role("combobox", name="Role", exact=True).first, "editor")
    env.click("Change role")
    page.get_by_text("ada is the last admin: make another user an admin first").wait_for()

    # Add zoe as an editor: she signs in, and gets no Users page.
    add = env.form("Add user")
    add.get_by_label("Name").fill("zoe")
    add.get_by_role("textbox", name="Password", exact=True).fill(ZOE_FIRST)
    add.get_by_label("Repeat the password").fill(ZOE_FIRST)
    _choose(page, add.get_by_role("combobox", name="Role"), "editor")
    add.get_by_role("button", name="Add user").click()
    page.get_by_text("zoe was added as an editor.").wait_for()
    zoe = _signs_in(env, "zoe", ZOE_FIRST)
    zoe.get_by_text("Signed in as zoe (editor)").wait_for()
    assert zoe.get_by_role("link", name="Users", exact=True).count() == 0
    zoe.context.close()

    # A new password and the admin role: the old password stops working, the new one gets
    # the Users page.
    settle(page)
    _users_change(env, "zoe")
    password = env.form("Reset password")
    password.get_by_label("New password").fill(ZOE_SECOND)
    password.get_by_label("Repeat the password").fill(ZOE_SECOND)
    password.get_by_role("button", name="Reset password").click()
    page.get_by_text("zoe's password was reset.").wait_for()
    settle(page)
    _users_change(env, "zoe")
    _choose(page, page.get_by_role("combobox", name="Role", exact=True).first, "admin")
    env.click("Change role")
    page.get_by_text("zoe is now an admin.").wait_for()
    refused = _signs_in(env, "zoe", ZOE_FIRST)
    assert refused.get_by_text("Wrong user name or password.").is_visible()
    refused.context.close()
    settle(page)
    env.shot("users")
    zoe = _signs_in(env, "zoe", ZOE_SECOND)
    zoe.get_by_text("Signed in as zoe (admin)").wait_for()
    assert zoe.get_by_role("link", name="Users", exact=True).count() == 1
    zoe.context.close()

    # Removed (after a confirmation), zoe can no longer sign in.
    settle(page)
    _users_change(env, "zoe")
    env.click("Remove user")
    page.get_by_text("Remove zoe? They can no longer sign in.").wait_for()
    env.click("Yes, remove")
    page.get_by_text("zoe was removed.").wait_for()
    gone = _signs_in(env, "zoe", ZOE_SECOND)
    assert gone.get_by_text("Wrong user name or password.").is_visible()
    gone.context.close()

    data = AdminData.open(env.database_url)
    trail = [(e.actor, e.name, e.detail) for e in data.user_changes()]
    data.close()
    assert trail[:4] == [
        ("ada", "zoe", "removed (was an admin)"),
        ("ada", "zoe", "role changed from editor to admin"),
        ("ada", "zoe", "password reset"),
        ("ada", "zoe", "added as an editor"),
    ]


def test_an_override_applies_until_it_expires(env: Env) -> None:
    page = env.page
    assert [env.decide("vip") for _ in range(3)] == [OK, OK, OVER]  # the rule: 2 per hour
    env.nav("Overrides & blocks")
    form = env.form("Set override")
    form.get_by_label("Descriptor").fill("user=vip")
    # 100 per second, the form's default limit.
    form.get_by_label("Expires in").fill(f"{TTL_S}s")
    form.get_by_label("Comment").fill("a partner's load test")
    form.get_by_role("button", name="Set override").click()
    page.get_by_text("Override: user=vip (version 2 of shop)").wait_for()
    [pin] = env.live().policy.pins
    assert pin.expires_at_s is not None
    expires_at = pin.expires_at_s

    # In force within a poll of the database, and until its time, on the server's clock.
    env.until("vip", OK, "the override to apply")
    assert time.time() < expires_at - 2, "the override went live too late to be watched"
    page.get_by_text("user=vip · 100 / second (fixed_window) · expires in").wait_for()
    env.shot("pins")
    answers: list[tuple[float, int, float]] = []  # (sent, code, answered)

    def refused() -> bool:
        sent = time.time()
        code = env.decide("vip")
        answers.append((sent, code, time.time()))
        return code == OVER

    wait_until(refused, expires_at - time.time() + 3, "the override to expire", 0.05)
    *admitted, (_, _, refused_at) = answers
    # Admitted only before its expiry (an OK sent at t was decided after t), refused (the
    # rule again: vip's 2 are spent) from it on (an OVER answered at t was decided before).
    assert admitted and all(code == OK for _, code, _ in admitted)
    assert admitted[-1][0] < expires_at <= refused_at
    assert refused_at - expires_at < 1.0
    page.get_by_text("user=vip · 100 / second (fixed_window) · expired at").wait_for()


def test_block_then_unblock(env: Env) -> None:
    page = env.page
    assert env.decide("mallory") == OK  # one of her two
    env.nav("Overrides & blocks")
    page.get_by_role("tab", name="Blocks").click()
    form = env.form("Block")
    form.get_by_label("Descriptor").fill("user=mallory")
    form.get_by_role("button", name="Block").click()
    page.get_by_text("Block: user=mallory (version").wait_for()
    # Not by asking for mallory until refused: each admitted ask before the block arrived
    # would spend her second request (a loaded CI run did, and she never got in again).
    env.serving_live_version("the block to apply")
    assert [env.decide("mallory") for _ in range(3)] == [OVER] * 3  # counting nothing

    page.get_by_role("tab", name="Blocks").click()
    row = page.locator('[data-testid="stHorizontalBlock"] >> visible=true').filter(
        has_text="user=mallory · no expiry"
    )
    row.get_by_role("button", name="Remove").click()
    page.get_by_text("Unblock: user=mallory (version").wait_for()
    env.serving_live_version("the unblock to apply")
    assert env.decide("mallory") == OK  # her second of two: the block counted nothing
    assert env.decide("mallory") == OVER  # and the rule counts again
    history = env.history()
    assert [(v.author, v.comment) for v in history[:2]] == [
        ("ada", "unblock"),
        ("ada", "block user=mallory"),
    ]


def test_let_an_offender_in_again_from_live_usage(env: Env) -> None:
    page = env.page
    assert [env.decide("eve") for _ in range(5)] == [OK, OK, OVER, OVER, OVER]
    env.nav("Live usage")
    page.get_by_text("Let a key in again").first.click()
    button = page.get_by_role("button", name="Let eve in again")
    button.wait_for()  # once the server has flushed eve's refusals (every 0.2 s)
    button.click()
    page.get_by_text("user=eve starts afresh on every server (version").wait_for()
    env.until("eve", OK, "the reset to apply")
    assert env.decide("eve") == OK and env.decide("eve") == OVER  # two more, afresh
    assert env.live().comment == "let user=eve in again"
