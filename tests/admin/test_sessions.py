"""Sessions as the app sees them (AppTest, each ``AppTest`` a browser tab of its own):
signing out ends every tab of the user, the idle timeout and the lifetime end a session on
the pages' clock, pending edits belong to the user and outlive the tab, and the sidebar's
domain picker takes every pick. The cookie and the reload are the browser's: see
tests/e2e/test_admin_sessions.py."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from sluice.clock import ManualClock
from sluice.policies.service import PolicyService
from sluice.policies.yaml_format import load_text
from tests.admin._harness import PASSWORD, errors, new_app, open_page, sign_in, texts
from tests.admin.conftest import _HASH
from tests.admin.test_rules import submit_form

T0 = 1_764_000_000.0


def titles(at: AppTest) -> list[str]:
    return [t.value for t in at.title]


def infos(at: AppTest) -> list[str]:
    return [i.value for i in at.info]


def test_signing_out_in_one_tab_ends_the_users_other_tabs(database_url: str) -> None:
    first, second = sign_in(new_app(), "ed"), sign_in(new_app(), "ed")
    viewer = sign_in(new_app(), "vi", PASSWORD)
    first.button(key="sign_out").click().run()
    assert titles(first) == ["Sluice admin"]
    second.switch_page("views/rules.py")  # any action: the next run finds the session ended
    second.run()
    assert titles(second) == ["Sluice admin"]
    assert infos(second) == ["You were signed out (here or in another tab or browser)."]
    assert not texts(second)  # no rule shown
    viewer.run()  # another user's session goes on
    assert titles(viewer) == ["Overview"]


def test_a_session_idle_longer_than_the_timeout_ends(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_ADMIN_SESSION_IDLE_TIMEOUT_S", "60")
    clock = ManualClock(T0)
    at = sign_in(new_app(clock), "ed")
    for _ in range(4):  # active for four minutes, never idle a whole one
        clock.advance(59)
        at = open_page(at, "rules")
        assert titles(at) == ["Rules"]
    clock.advance(61)
    at.run()
    assert titles(at) == ["Sluice admin"]
    assert infos(at) == ["You were signed out after 1 minute without activity. Sign in again."]
    at = sign_in(at, "ed")
    assert titles(at) == ["Rules"]  # back on the page it was on
    assert not [i for i in infos(at) if "signed out" in i]


def test_a_session_ends_at_its_lifetime_however_busy(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_ADMIN_SESSION_LIFETIME_S", "7200")
    clock = ManualClock(T0)
    at = sign_in(new_app(clock), "ed")
    for _ in range(7):
        clock.advance(1000)
        at.run()
        assert titles(at) == ["Overview"]
    clock.advance(1000)
    at.run()
    assert infos(at) == ["Your session reached its limit of 2 hours. Sign in again."]


def test_pending_edits_belong_to_the_user_and_outlive_the_tab(
    database_url: str, service: PolicyService, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_ADMIN_USERS", f"ed:editor:{_HASH},al:editor:{_HASH}")
    at = open_page(sign_in(new_app(), "ed"), "rules")
    at.button(key="rules_edit_0").click().run()
    at = submit_form(at, rpu=7)
    assert "shop.user: 7 / minute" in texts(at)

    later = open_page(sign_in(new_app(), "ed"), "rules")  # another tab, or after a reload
    assert "shop.user: 7 / minute" in texts(later)
    assert "Domain shop: live version 1 · unpublished changes" in [c.value for c in later.caption]
    other = open_page(sign_in(new_app(), "al"), "rules")  # another editor: not theirs
    assert "shop.user: 5 / minute" in texts(other)

    later.button(key="rules_publish").click().run()
    assert [s.value for s in later.success] == ["Published version 2 of shop."]
    at = open_page(at, "rules")  # the first tab: published, so nothing pending
    assert "Domain shop: live version 2" in [c.value for c in at.caption]
    assert "shop.user: 7 / minute" in texts(at)


def test_a_new_domain_being_written_outlives_the_tab(database_url: str) -> None:
    at = open_page(sign_in(new_app(), "ed"), "rules")
    at.text_input(key="rules_new_domain").input("edge").run()
    at.button(key="rules_create_domain").click().run()
    at.button(key="rules_add").click().run()
    at = submit_form(at, key="ip", rpu=3)
    assert "edge.ip: 3 / minute" in texts(at)
    later = open_page(sign_in(new_app(), "ed"), "rules")
    later.sidebar.selectbox[0].set_value("edge").run()
    assert "edge.ip: 3 / minute" in texts(later)
    assert not errors(later)


def test_the_domain_picker_takes_every_pick(database_url: str, service: PolicyService) -> None:
    for domain in ("edge", "mail"):
        service.publish(
            load_text(f"domain: {domain}\ndescriptors:\n  - key: ip\n"), author="x", comment=""
        )
    at = open_page(sign_in(new_app(), "ed"), "rules")
    for domain in ("shop", "edge", "mail", "shop", "mail"):
        at.sidebar.selectbox[0].set_value(domain).run()
        assert [c.value for c in at.caption][0] == f"Domain {domain}: live version 1"
    at = open_page(at, "history")  # kept across pages, and back
    at = open_page(at, "rules")
    assert [c.value for c in at.caption][0] == "Domain mail: live version 1"


def test_a_changed_role_applies_at_once_and_a_removed_account_ends_the_session(
    database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at = sign_in(new_app(), "ed")
    assert "Signed in as ed (editor)" in [t.value for t in at.sidebar.text]
    monkeypatch.setenv("SLUICE_ADMIN_USERS", f"ed:viewer:{_HASH}")
    at.run()
    assert "Signed in as ed (viewer)" in [t.value for t in at.sidebar.text]
    monkeypatch.setenv("SLUICE_ADMIN_USERS", "")
    at.run()
    assert titles(at) == ["Sluice admin"]
    assert infos(at) == ["You were signed out: your account no longer exists here."]
