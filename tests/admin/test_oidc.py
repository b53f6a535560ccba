"""Single sign-on's settings and the identity provider's claims, as plain functions.

There is no identity provider here: the round trip through one (st.login, the provider's
sign-in, Streamlit's /oauth2callback) is not tested end to end. What is tested is what Sluice
adds: the settings checked and turned into Streamlit's [auth] secrets, a claim mapped to a
role (or refused), and which identity tokens may start a session.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sluice.settings import Settings
from sluice_admin.auth import Role
from sluice_admin.oidc import (
    FRESH_S,
    OidcConfig,
    identity,
    is_fresh,
    oidc_config,
    parse_roles,
    role_for,
    streamlit_secrets,
    user_name,
)
from tests.support.processes import run_sluice

SSO = Settings(
    admin_oidc_metadata_url="https://idp.example.com/.well-known/openid-configuration",
    admin_oidc_client_id="sluice-admin",
    admin_oidc_client_secret="s3cret",
    admin_oidc_redirect_uri="https://admin.example.com/oauth2callback",
    admin_oidc_roles="sluice-editors:editor, sluice-viewers:viewer,urn:group:ops:editor",
)
CONFIG = oidc_config(SSO)


def test_off_unless_configured() -> None:
    assert oidc_config(Settings()) is None


def test_the_settings_become_a_config_and_streamlits_secrets() -> None:
    assert CONFIG == OidcConfig(
        SSO.admin_oidc_metadata_url,
        "sluice-admin",
        "s3cret",
        "https://admin.example.com/oauth2callback",
        "groups",
        {
            "sluice-editors": Role.EDITOR,
            "sluice-viewers": Role.VIEWER,
            "urn:group:ops": Role.EDITOR,
        },
    )
    assert streamlit_secrets(CONFIG, "cookie-key") == {
        "auth": {
            "redirect_uri": "https://admin.example.com/oauth2callback",
            "cookie_secret": "cookie-key",
            "sso": {
                "client_id": "sluice-admin",
                "client_secret": "s3cret",
                "server_metadata_url": SSO.admin_oidc_metadata_url,
            },
        }
    }


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"admin_oidc_client_secret": "", "admin_oidc_roles": ""},
            "single sign-on needs --admin-oidc-client-secret, --admin-oidc-roles too (or unset "
            "--admin-oidc-metadata-url, --admin-oidc-client-id, --admin-oidc-redirect-uri)",
        ),
        (
            {"admin_oidc_metadata_url": "http://idp.example.com/.well-known/openid-configuration"},
            "--admin-oidc-metadata-url: 'http://idp.example.com/.well-known/openid-configuration'"
            " must be an https:// URL (http:// only for localhost)",
        ),
        (
            {"admin_oidc_redirect_uri": "https://admin.example.com/callback"},
            "--admin-oidc-redirect-uri: must be the app's address plus /oauth2callback (where "
            "Streamlit receives the provider's answer)",
        ),
        ({"admin_oidc_role_claim": " "}, "--admin-oidc-role-claim: may not be empty"),
        (
            {"admin_oidc_roles": "sluice-editors:owner"},
            "--admin-oidc-roles entry 1: role must be viewer, editor, admin, not 'owner'",
        ),
        (
            {"admin_oidc_roles": "a:viewer,editor"},
            "--admin-oidc-roles entry 2: expected CLAIM_VALUE:ROLE",
        ),
        ({"admin_oidc_roles": " , "}, "--admin-oidc-roles: maps no claim value to a role"),
    ],
)
def test_a_bad_configuration_names_the_setting(changes: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError) as info:
        oidc_config(dataclasses.replace(SSO, **changes))
    assert str(info.value) == message


def test_localhost_may_use_http() -> None:
    local = dataclasses.replace(
        SSO,
        admin_oidc_metadata_url="http://127.0.0.1:8080/.well-known/openid-configuration",
        admin_oidc_redirect_uri="http://localhost:8501/oauth2callback",
    )
    assert oidc_config(local) is not None


def test_roles_come_from_the_claim_and_the_highest_wins() -> None:
    assert CONFIG is not None
    admins = dataclasses.replace(CONFIG, roles={**CONFIG.roles, "sluice-admins": Role.ADMIN})
    assert role_for({"groups": ["sluice-editors", "sluice-admins"]}, admins) is Role.ADMIN
    assert role_for({"groups": ["staff", "sluice-viewers"]}, CONFIG) is Role.VIEWER
    assert role_for({"groups": ["sluice-viewers", "sluice-editors"]}, CONFIG) is Role.EDITOR
    assert role_for({"groups": "urn:group:ops"}, CONFIG) is Role.EDITOR  # one string
    config = dataclasses.replace(CONFIG, role_claim="roles")
    assert role_for({"roles": ["sluice-viewers"], "groups": ["sluice-editors"]}, config) is (
        Role.VIEWER
    )


@pytest.mark.parametrize(
    "claims",
    [
        {},
        {"groups": []},
        {"groups": ["staff"]},
        {"groups": 7},
        {"groups": [None, 3]},
        {"groups": "SLUICE-EDITORS"},
    ],
)
def test_a_user_without_a_mapped_role_gets_none(claims: dict[str, object]) -> None:
    assert CONFIG is not None
    assert role_for(claims, CONFIG) is None


def test_parse_roles_keeps_colons_in_the_claim_value() -> None:
    assert parse_roles("urn:a:b:viewer,") == {"urn:a:b": Role.VIEWER}


def test_the_user_is_named_by_email_then_username_then_subject() -> None:
    assert user_name({"sub": "1", "preferred_username": "ann", "email": "ann@x.org"}) == (
        "ann@x.org"
    )
    assert user_name({"sub": "1", "preferred_username": "ann"}) == "ann"
    assert user_name({"sub": "1"}) == "1"
    assert user_name({"email": " "}) is None


def test_only_a_fresh_identity_token_may_start_a_session() -> None:
    assert is_fresh({"iat": 1_000}, now_s=1_000 + FRESH_S)
    assert not is_fresh({"iat": 1_000}, now_s=1_000 + FRESH_S + 1)
    assert is_fresh({"iat": 1_000}, now_s=1_000 - 60)  # a minute of clock skew
    assert not is_fresh({"iat": 1_000}, now_s=1_000 - 61)
    for claims in ({}, {"iat": "1000"}, {"iat": True}):
        assert not is_fresh(claims, now_s=1_000)


def test_each_identity_token_has_its_own_mark() -> None:
    claims = {"iss": "https://idp", "sub": "1", "iat": 1_000}
    assert identity(claims) == identity(dict(claims))
    assert identity(claims) != identity({**claims, "iat": 1_001})
    assert identity(claims) != identity({**claims, "sub": "2"})


def test_sluice_admin_refuses_a_partial_configuration_before_starting(tmp_path: Path) -> None:
    result = run_sluice(
        ["admin", "--admin-oidc-client-id", "x", "--database-url", f"sqlite:///{tmp_path}/c.db"]
    )
    assert (result.returncode, result.stdout) == (1, "")
    assert result.stderr == (
        "sluice: single sign-on needs --admin-oidc-metadata-url, --admin-oidc-client-secret, "
        "--admin-oidc-redirect-uri, --admin-oidc-roles too (or unset --admin-oidc-client-id)\n"
    )
