"""Users: the rules of a change (users.py), the store writing it with its audit entry
(accounts.py), and the Users page that admins alone reach (views/users.py)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest
from streamlit.testing.v1 import AppTest

from sluice_admin.auth import Account, Role, User, check_credentials, hash_password
from sluice_admin.data import AdminData, NotAllowedError
from sluice_admin.users import Action, UserChange, UserChangeError, check
from tests.admin._harness import (
    ON_BOTH_DATABASES,
    PASSWORD,
    errors,
    new_app,
    no_exceptions,
    open_page,
    sign_in,
)
from tests.support.processes import run_sluice, wait_until


def successes(at: AppTest) -> list[str]:
    return [s.value.replace("\\", "") for s in at.success]


def shown_errors(at: AppTest) -> list[str]:
    """The errors as read (the page escapes Markdown in user-written text)."""
    return [e.replace("\\", "") for e in errors(at)]


A, E, V = Role.ADMIN, Role.EDITOR, Role.VIEWER
NEW_PASSWORD = "a new password"


# -- users.check: who may change whom -----------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "stored", "setting", "refused"),
    [
        # The last admin stays: neither removed nor demoted, by anyone (themselves included).
        (UserChange(Action.REMOVE, "ada"), {"ada": A}, {}, "ada is the last admin"),
        (UserChange(Action.ROLE, "ada", E), {"ada": A}, {}, "ada is the last admin"),
        # ... unless another admin is left, from the database or the setting.
        (UserChange(Action.REMOVE, "ada"), {"ada": A, "bo": A}, {}, None),
        (UserChange(Action.ROLE, "bo", V), {"ada": A, "bo": A}, {}, None),
        (UserChange(Action.REMOVE, "bo"), {"bo": A}, {"ada": A}, None),
        (UserChange(Action.PASSWORD, "ada"), {"ada": A}, {}, None),
        # Users of the setting are changed in the setting.
        (UserChange(Action.REMOVE, "ed"), {"ada": A, "ed": E}, {"ed": E}, "is defined by"),
        (UserChange(Action.ADD, "ed", V), {"ada": A}, {"ed": E}, "is defined by"),
        (UserChange(Action.ADD, "vi", V), {"ada": A, "vi": V}, {}, "vi exists already"),
        (UserChange(Action.REMOVE, "zed"), {"ada": A}, {}, "there is no user zed"),
        (UserChange(Action.ROLE, "vi", V), {"ada": A, "vi": V}, {}, "vi is already a viewer"),
    ],
)
def test_check(
    change: UserChange, stored: dict[str, Role], setting: dict[str, Role], refused: str | None
) -> None:
    actor = "ada" if "ada" in {**stored, **setting} else "bo"
    if refused is None:
        check(change, actor=actor, stored=stored, setting=setting)
    else:
        with pytest.raises(UserChangeError, match=refused):
            check(change, actor=actor, stored=stored, setting=setting)


def test_only_an_admin_as_of_now_changes_users() -> None:
    # Demoted (or removed) since signing in: the session's role no longer counts.
    with pytest.raises(UserChangeError, match="ada is not an admin \\(any more\\)"):
        check(UserChange(Action.REMOVE, "vi"), actor="ada", stored={"ada": E, "vi": V}, setting={})
    with pytest.raises(UserChangeError, match="ada is not an admin"):
        check(UserChange(Action.REMOVE, "vi"), actor="ada", stored={"vi": V}, setting={})


# -- the store: each change with its audit entry ------------------------------------------------

_HASH = hash_password(PASSWORD)


@pytest.fixture
def data(database_url: str) -> Iterator[AdminData]:
    opened = AdminData.open(database_url)
    opened.save_account(Account("ada", Role.ADMIN, _HASH), actor="root (sluice admin-user)")
    yield opened
    opened.close()


ADA = User("ada", Role.ADMIN)


@ON_BOTH_DATABASES
def test_every_change_is_audited_without_its_password(data: AdminData) -> None:
    data.change_user(ADA, UserChange(Action.ADD, "zoe", V, hash_password("x" * 8)), setting={})
    data.change_user(ADA, UserChange(Action.ROLE, "zoe", A), setting={})
    data.change_user(ADA, UserChange(Action.PASSWORD, "zoe", password_hash=_HASH), setting={})
    data.change_user(ADA, UserChange(Action.REMOVE, "ada"), setting={})  # zoe is an admin now
    assert "ada" not in data.accounts()
    assert data.accounts()["zoe"] == Account("zoe", A, _HASH)
    trail = [(e.actor, e.action, e.name, e.detail) for e in data.user_changes()]
    assert trail[:4] == [
        ("ada", "remove", "ada", "removed (was an admin)"),
        ("ada", "password", "zoe", "password reset"),
        ("ada", "role", "zoe", "role changed from viewer to admin"),
        ("ada", "add", "zoe", "added as a viewer"),
    ]
    assert trail[4] == ("root (sluice admin-user)", "add", "ada", "added as an admin")
    assert not any("scrypt" in str(entry) for entry in data.user_changes())


@ON_BOTH_DATABASES
def test_a_refused_change_writes_nothing(data: AdminData) -> None:
    before = data.user_changes()
    with pytest.raises(UserChangeError, match="ada is the last admin"):
        data.change_user(ADA, UserChange(Action.ROLE, "ada", E), setting={"ed": E})
    with pytest.raises(NotAllowedError, match="ed is an editor: only admins manage users"):
        data.change_user(User("ed", E), UserChange(Action.REMOVE, "vi"), setting={"ed": E})
    assert data.accounts()["ada"].role is A and "vi" in data.accounts()
    assert data.user_changes() == before


def test_admin_user_add_is_audited_as_the_system_user(database_url: str, data: AdminData) -> None:
    added = run_sluice(
        ["admin-user", "add", "sam", "--role", "admin", "--database-url", database_url],
        input="long enough pw\n",
    )
    assert added.returncode == 0, added.stderr
    [entry] = [e for e in data.user_changes() if e.name == "sam"]
    assert (entry.action, entry.detail) == ("add", "added as an admin")
    assert entry.actor.endswith(" (sluice admin-user)")


def test_two_admins_demoting_each_other_at_once_leave_one_on_postgresql(
    postgres_url: str,
) -> None:
    # Another admin's transaction is demoting ada and holds the rows; bo's change to demote
    # himself must wait for it and then see ada demoted, not the admins as they were.
    data = AdminData.open(postgres_url)
    for name in ("ada", "bo"):
        data.save_account(Account(name, A, _HASH), actor="seed")
    outcome: list[BaseException | None] = []
    with psycopg.connect(postgres_url) as other, psycopg.connect(postgres_url) as watcher:
        other.execute("SELECT name FROM admin_users FOR UPDATE")
        other.execute("UPDATE admin_users SET role = 'editor' WHERE name = 'ada'")

        def demote_bo() -> None:
            try:
                data.change_user(User("bo", A), UserChange(Action.ROLE, "bo", E), setting={})
                outcome.append(None)
            except UserChangeError as exc:
                outcome.append(exc)

        thread = threading.Thread(target=demote_bo)
        thread.start()
        waiting = (
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        wait_until(
            lambda: watcher.execute(waiting).fetchone() == (1,) or not thread.is_alive(),
            10,
            "bo's change to wait for the other transaction",
        )
        other.commit()
        thread.join(10)
    [refused] = outcome
    assert isinstance(refused, UserChangeError), "both admins were demoted"
    assert str(refused) == "bo is the last admin: make another user an admin first"
    roles = {name: account.role for name, account in data.accounts().items()}
    data.close()
    assert roles == {"ada": E, "bo": A}


# -- the page ---------------------------------------------------------------------------------


def users_page(name: str = "ada") -> AppTest:
    return open_page(sign_in(new_app(), name), "users")


def test_only_admins_get_the_users_page(data: AdminData) -> None:
    # Not registered for an editor: no link, and no URL reaches it.
    editor = sign_in(new_app(), "ed")
    with pytest.raises(ValueError, match="Could not find a navigation page"):
        open_page(editor, "users")
    assert [t.value for t in users_page("ada").title] == ["Users"]


@ON_BOTH_DATABASES
def test_add_change_reset_and_remove_a_user(data: AdminData) -> None:
    at = users_page()
    no_exceptions(at)
    [listing, trail] = at.dataframe
    assert listing.value.to_dict("records") == [
        {"user": "ada", "role": "admin", "defined in": "database"},
        {"user": "ed", "role": "editor", "defined in": "--admin-users setting"},
        {"user": "vi", "role": "viewer", "defined in": "database"},
    ]

    at.text_input(key="users_add_name").input("zoe")
    at.selectbox(key="users_add_role").set_value("editor")
    at.text_input(key="users_add_password").input("zoe's password")
    at.text_input(key="users_add_again").input("zoe's password")
    at.button(key="users_add_submit").click().run()
    no_exceptions(at)
    assert successes(at) == ["zoe was added as an editor."]
    assert check_credentials(data.accounts(), "zoe", "zoe's password") == User("zoe", E)

    at.selectbox(key="users_pick").set_value("zoe").run()
    at.selectbox(key="users_role_zoe").set_value("admin").run()
    at.button(key="users_set_role").click().run()
    assert successes(at) == ["zoe is now an admin."]

    at.selectbox(key="users_pick").set_value("zoe").run()
    at.text_input(key="users_new_password").input(NEW_PASSWORD)
    at.text_input(key="users_new_again").input(NEW_PASSWORD)
    at.button(key="users_set_password").click().run()
    assert successes(at) == ["zoe's password was reset."]
    assert check_credentials(data.accounts(), "zoe", "zoe's password") is None
    assert check_credentials(data.accounts(), "zoe", NEW_PASSWORD) == User("zoe", A)

    at.selectbox(key="users_pick").set_value("vi").run()
    at.button(key="users_remove").click().run()
    assert "Remove vi? They can no longer sign in." in [w.value for w in at.warning]
    assert "vi" in data.accounts()  # not before the confirmation
    at.button(key="users_remove_yes").click().run()
    assert successes(at) == ["vi was removed."]
    assert "vi" not in data.accounts()
    trail = at.dataframe[1].value
    assert trail[["by", "user", "what"]].to_dict("records")[:4] == [
        {"by": "ada", "user": "vi", "what": "removed (was a viewer)"},
        {"by": "ada", "user": "zoe", "what": "password reset"},
        {"by": "ada", "user": "zoe", "what": "role changed from editor to admin"},
        {"by": "ada", "user": "zoe", "what": "added as an editor"},
    ]


def test_the_last_admin_cannot_remove_or_demote_themselves(data: AdminData) -> None:
    at = users_page()
    at.selectbox(key="users_pick").set_value("ada").run()
    at.selectbox(key="users_role_ada").set_value("editor").run()
    at.button(key="users_set_role").click().run()
    assert shown_errors(at) == ["ada is the last admin: make another user an admin first"]
    at.button(key="users_remove").click().run()
    at.button(key="users_remove_yes").click().run()
    assert shown_errors(at) == ["ada is the last admin: make another user an admin first"]
    assert data.accounts()["ada"].role is A


def test_bad_input_is_named(data: AdminData) -> None:
    at = users_page()
    for name, first, again, error in [
        ("a:b", "long enough", "long enough", "name: a user name must be 1-255 characters"),
        ("zoe", "short", "short", "password: must have at least 8 characters"),
        ("zoe", "long enough", "long enuogh", "password: the two entries differ"),
        ("ed", "long enough", "long enough", "ed is defined by the --admin-users setting"),
    ]:
        at.text_input(key="users_add_name").input(name)
        at.text_input(key="users_add_password").input(first)
        at.text_input(key="users_add_again").input(again)
        at.button(key="users_add_submit").click().run()
        [shown] = shown_errors(at)
        assert shown.startswith(error), (shown, error)
    assert set(data.accounts()) == {"ada", "vi"}
