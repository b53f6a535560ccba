"""Single sign-on as the app handles the identity provider's answer, with AppTest standing in
for the provider (``at.user`` is what ``st.user`` reads after Streamlit's /oauth2callback).

Not tested: the round trip through a real provider (there is none here). See
tests/admin/test_oidc.py for the settings and the claim mapping as plain functions.
"""

from __future__ import annotations

import time

import pytest
from streamlit.testing.v1 import AppTest

from tests.admin._harness import errors, new_app

SSO = {
    "SLUICE_ADMIN_OIDC_METADATA_URL": "https://idp.example.com/.well-known/openid-configuration",
    "SLUICE_ADMIN_OIDC_CLIENT_ID": "sluice-admin",
    "SLUICE_ADMIN_OIDC_CLIENT_SECRET": "s3cret",
    "SLUICE_ADMIN_OIDC_REDIRECT_URI": "https://admin.example.com/oauth2callback",
    "SLUICE_ADMIN_OIDC_ROLES": "sluice-editors:editor,sluice-viewers:viewer",
}


@pytest.fixture
def sso(database_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in SSO.items():
        monkeypatch.setenv(name, value)


def back_from_the_provider(**claims: object) -> AppTest:
    at = new_app()
    at.user = {"is_logged_in": True, "iss": "https://idp.example.com", "sub": "42", **claims}
    return at.run()


def sidebar(at: AppTest) -> list[str]:
    return [t.value for t in at.sidebar.text]


def test_the_sign_in_page_offers_single_sign_on(sso: None) -> None:
    at = new_app().run()
    assert at.button(key="sign_in_sso").label == "Sign in with single sign-on"
    assert [t.label for t in at.text_input] == ["User name", "Password"]  # passwords still work


def test_a_mapped_group_signs_in_with_its_role(sso: None) -> None:
    at = back_from_the_provider(
        email="ann@example.com", groups=["staff", "sluice-editors"], iat=int(time.time())
    )
    assert [t.value for t in at.title] == ["Overview"]
    assert "Signed in as ann@example.com (editor)" in sidebar(at)


def test_a_user_without_a_mapped_role_is_refused(sso: None) -> None:
    at = back_from_the_provider(email="bob@example.com", groups=["staff"], iat=int(time.time()))
    assert [t.value for t in at.title] == ["Sluice admin"]
    assert errors(at) == [
        "bob@example.com signed in with single sign-on, but has no role in this admin app: the "
        "'groups' claim names no group that is given one. Ask an administrator to add you to one."
    ]


def test_a_stale_or_used_answer_starts_no_session(sso: None) -> None:
    # Streamlit keeps the provider's answer in a cookie for 30 days: after signing out, an old
    # one must not sign the browser in again.
    stale = back_from_the_provider(
        email="ann@example.com", groups=["sluice-viewers"], iat=int(time.time()) - 301
    )
    assert [t.value for t in stale.title] == ["Sluice admin"] and not errors(stale)

    issued = int(time.time())
    first = back_from_the_provider(email="ann@example.com", groups=["sluice-viewers"], iat=issued)
    assert "Signed in as ann@example.com (viewer)" in sidebar(first)
    again = back_from_the_provider(email="ann@example.com", groups=["sluice-viewers"], iat=issued)
    assert [t.value for t in again.title] == ["Sluice admin"] and not errors(again)


def test_a_misconfigured_single_sign_on_is_named_on_the_sign_in_page(
    sso: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLUICE_ADMIN_OIDC_ROLES", "sluice-editors:owner")
    at = new_app().run()
    assert errors(at) == [
        "Single sign-on is misconfigured: --admin-oidc-roles entry 1: role must be viewer, "
        "editor, admin, not 'owner'"
    ]
    assert [t.label for t in at.text_input] == ["User name", "Password"]
