"""The sign-in gate: nothing without it, wrong passwords, throttling, both user sources."""

from __future__ import annotations

import pytest

from tests.admin._harness import (
    ON_BOTH_DATABASES,
    PASSWORD,
    errors,
    new_app,
    no_exceptions,
    open_page,
    sign_in,
)

# Accounts and sign-in read the config database: on both dialects.
pytestmark = ON_BOTH_DATABASES


def test_nothing_but_the_sign_in_form_before_signing_in(database_url: str) -> None:
    at = new_app().run()
    no_exceptions(at)
    assert [t.value for t in at.title] == ["Sluice admin"]
    assert [t.label for t in at.text_input] == ["User name", "Password"]
    # The other pages are not even registered until someone signs in.
    with pytest.raises(ValueError):
        at.switch_page("views/rules.py")
    assert not at.text  # no rule (nor anything else) rendered


def test_an_editor_from_the_setting_signs_in(database_url: str) -> None:
    at = sign_in(new_app(), "ed")
    no_exceptions(at)
    assert [t.value for t in at.title] == ["Overview"]
    assert "Signed in as ed (editor)" in [t.value for t in at.sidebar.text]


def test_a_viewer_from_the_database_signs_in(database_url: str) -> None:
    at = sign_in(new_app(), "vi")
    assert "Signed in as vi (viewer)" in [t.value for t in at.sidebar.text]


@pytest.mark.parametrize(("name", "password"), [("ed", "wrong"), ("nobody", PASSWORD)])
def test_a_wrong_name_or_password_is_refused_alike(
    database_url: str, name: str, password: str
) -> None:
    at = sign_in(new_app(), name, password)
    assert errors(at) == ["Wrong user name or password."]
    assert [t.value for t in at.title] == ["Sluice admin"]


def test_failed_sign_ins_are_throttled_per_name(database_url: str) -> None:
    at = new_app()
    for _ in range(5):
        sign_in(at, "ed", "wrong")
        assert errors(at) == ["Wrong user name or password."]
    # The sixth try within the minute is refused before the password is even checked:
    # 5 per minute in a burst of 5 is one every 12 s once the burst is spent.
    sign_in(at, "ed", PASSWORD)
    [message] = errors(at)
    assert message.startswith("Too many sign-in attempts for 'ed'. Try again in ")
    assert int(message.split()[-2]) in range(1, 13)
    assert [t.value for t in at.title] == ["Sluice admin"]
    # Another name is not affected, also from a fresh browser session.
    assert [t.value for t in sign_in(new_app(), "vi").title] == ["Overview"]


def test_signing_out_returns_to_the_gate(database_url: str) -> None:
    at = open_page(sign_in(new_app(), "ed"), "rules")
    at.button(key="sign_out").click().run()
    assert [t.value for t in at.title] == ["Sluice admin"]


def test_a_bad_users_setting_is_reported(database_url: str, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("SLUICE_ADMIN_USERS", "ed:root:scrypt$1$1$1$00$00")
    at = sign_in(new_app(), "ed")
    assert errors(at) == [
        "The admin users setting is invalid: SLUICE_ADMIN_USERS entry 1: "
        "role must be viewer, editor or admin"
    ]
