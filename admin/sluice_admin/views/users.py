"""Users (admins only): list, add, remove, change a role, reset a password; and the audit
trail of every such change. The rules (who may, the last admin) are in ``users.py``."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from sluice.errors import SluiceError
from sluice_admin import session
from sluice_admin.auth import Account, Role, User, hash_password, parse_users
from sluice_admin.data import AdminData
from sluice_admin.users import (
    Action,
    UserChange,
    UserChangeError,
    a_role,
    check_name,
    check_password,
)

_NOTICE = "users_notice"
_CONFIRM = "users_confirm_remove"
ROLES = [r.value for r in Role]


def render() -> None:
    st.title("Users")
    user = session.current_user()
    if not user.can_manage_users:
        st.error("Only admins manage users.")
        return
    data = session.data()
    with session.guarded():
        try:
            setting = parse_users(session.settings().admin_users)
        except ValueError as exc:
            st.error(f"The admin users setting is invalid: {session.escape(str(exc))}")
            return
        notice = st.session_state.pop(_NOTICE, None)
        if notice:
            st.success(notice)  # built with escaped user data
        stored = data.accounts()
        _listing(stored, setting)
        editable = sorted(n for n in stored if n not in setting)
        if editable:
            _change(data, user, editable, stored, setting)
        _add(data, user, setting)
        _trail(data)


def _listing(stored: dict[str, Account], setting: dict[str, Account]) -> None:
    rows = [
        (name, account.role.value, "--admin-users setting" if name in setting else "database")
        for name, account in sorted({**stored, **setting}.items())
    ]
    st.dataframe(
        pd.DataFrame(rows, columns=["user", "role", "defined in"]), hide_index=True, width="stretch"
    )
    if setting:
        st.caption(
            "Users from the --admin-users setting (SLUICE_ADMIN_USERS) are changed there; "
            "the setting wins over a database user of the same name."
        )


def _change(
    data: AdminData,
    user: User,
    names: list[str],
    stored: dict[str, Account],
    setting: dict[str, Account],
) -> None:
    st.subheader("Change a user")
    name = st.selectbox("User", names, key="users_pick")
    role_column, password_column = st.columns(2)
    with role_column:
        current = stored[name].role.value
        role = st.selectbox("Role", ROLES, index=ROLES.index(current), key=f"users_role_{name}")
        if st.button("Change role", key="users_set_role", disabled=role == current):
            change = UserChange(Action.ROLE, name, Role(role))
            _apply(data, user, change, setting, f"{name} is now {a_role(Role(role))}.")
        if st.session_state.get(_CONFIRM) == name:
            _confirm_remove(data, user, name, setting)
        elif st.button("Remove user", key="users_remove"):
            st.session_state[_CONFIRM] = name
            st.rerun()
    with password_column, st.form("users_password", border=False, clear_on_submit=True):
        first = st.text_input("New password", type="password", key="users_new_password")
        again = st.text_input("Repeat the password", type="password", key="users_new_again")
        if st.form_submit_button("Reset password", key="users_set_password"):
            hashed = _hashed(first, again)
            if hashed is not None:
                change = UserChange(Action.PASSWORD, name, password_hash=hashed)
                _apply(data, user, change, setting, f"{name}'s password was reset.")


def _confirm_remove(data: AdminData, user: User, name: str, setting: dict[str, Account]) -> None:
    st.warning(f"Remove {session.escape(name)}? They can no longer sign in.")
    yes, no = st.columns(2)
    if no.button("Cancel", key="users_remove_cancel"):
        del st.session_state[_CONFIRM]
        st.rerun()
    if yes.button("Yes, remove", type="primary", key="users_remove_yes"):
        del st.session_state[_CONFIRM]
        _apply(data, user, UserChange(Action.REMOVE, name), setting, f"{name} was removed.")


def _add(data: AdminData, user: User, setting: dict[str, Account]) -> None:
    st.subheader("Add a user")
    with st.form("users_add", clear_on_submit=True):  # no password left behind
        name_column, role_column = st.columns(2)
        name = name_column.text_input("Name", key="users_add_name")
        role = role_column.selectbox("Role", ROLES, key="users_add_role")
        first = st.text_input("Password", type="password", key="users_add_password")
        again = st.text_input("Repeat the password", type="password", key="users_add_again")
        if not st.form_submit_button("Add user", type="primary", key="users_add_submit"):
            return
    try:
        name = check_name(name)
    except UserChangeError as exc:
        st.error(session.escape(str(exc)))
        return
    hashed = _hashed(first, again)
    if hashed is not None:
        change = UserChange(Action.ADD, name, Role(role), hashed)
        _apply(data, user, change, setting, f"{name} was added as {a_role(Role(role))}.")


def _hashed(first: str, again: str) -> str | None:
    """The new password's hash, or None after saying what is wrong with it."""
    try:
        check_password(first)
    except UserChangeError as exc:
        st.error(str(exc))
        return None
    if first != again:
        st.error("password: the two entries differ")
        return None
    return hash_password(first)


def _apply(
    data: AdminData, user: User, change: UserChange, setting: dict[str, Account], done: str
) -> None:
    try:
        data.change_user(user, change, setting={n: a.role for n, a in setting.items()})
    except SluiceError as exc:
        st.error(session.escape(str(exc)))
        return
    st.session_state[_NOTICE] = session.escape(done)
    st.rerun()


def _trail(data: AdminData) -> None:
    st.subheader("Changes")
    entries = data.user_changes()
    if not entries:
        st.caption("No user has been changed yet.")
        return
    rows = [
        (e.created_at.strftime("%Y-%m-%d %H:%M:%S UTC"), e.actor, e.name, e.detail) for e in entries
    ]
    st.dataframe(
        pd.DataFrame(rows, columns=["when", "by", "user", "what"]), hide_index=True, width="stretch"
    )


if __name__ == "__main__":
    render()
