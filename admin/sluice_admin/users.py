"""Changes to the admin app's users, checked before any is written: pure Python.

A change is one of ``add``, ``remove``, ``role`` and ``password``. It is checked against who
exists now, in the database and in the ``--admin-users`` setting, so that:

- only an admin (as of now, not as of their sign-in) changes users;
- users from the setting are changed in the setting, not here;
- the app always keeps an admin: the last one can be neither removed nor demoted.

Each accepted change is written with an entry for the audit trail (:func:`describe`), which
never holds a password or its hash.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from sluice.errors import SluiceError
from sluice_admin.auth import MAX_NAME_LENGTH, Role

__all__ = [
    "MIN_PASSWORD_LENGTH",
    "Action",
    "UserChange",
    "UserChangeError",
    "a_role",
    "check",
    "check_name",
    "check_password",
    "describe",
]

MIN_PASSWORD_LENGTH = 8


class UserChangeError(SluiceError):
    """A change to the users that is not allowed or not possible; the message says why."""


class Action(enum.StrEnum):
    ADD = "add"
    REMOVE = "remove"
    ROLE = "role"
    PASSWORD = "password"


@dataclass(frozen=True)
class UserChange:
    action: Action
    name: str
    role: Role | None = None  # add, role: the (new) role
    password_hash: str | None = None  # add, password: the new password's hash


def check_name(name: str) -> str:
    """``name`` without surrounding spaces, or UserChangeError: 1-255 characters without
    ``:`` or ``,`` (they separate the entries of ``--admin-users``)."""
    name = name.strip()
    if not name or any(c in name for c in ":,") or len(name) > MAX_NAME_LENGTH:
        raise UserChangeError(
            f"name: a user name must be 1-{MAX_NAME_LENGTH} characters without ':' or ','"
        )
    return name


def check_password(password: str) -> None:
    if len(password) < MIN_PASSWORD_LENGTH:
        raise UserChangeError(f"password: must have at least {MIN_PASSWORD_LENGTH} characters")


def check(
    change: UserChange,
    *,
    actor: str,
    stored: Mapping[str, Role],
    setting: Mapping[str, Role],
) -> None:
    """UserChangeError unless ``actor`` may make ``change`` to the users ``stored`` in the
    database and those the ``setting`` gives (which wins on a clash, as at sign-in)."""
    effective = {**stored, **setting}
    if effective.get(actor) is not Role.ADMIN:
        raise UserChangeError(f"{actor} is not an admin (any more): only admins manage users")
    name = change.name
    if name in setting:
        raise UserChangeError(
            f"{name} is defined by the --admin-users setting (SLUICE_ADMIN_USERS): change it there"
        )
    if change.action is Action.ADD:
        if name in stored:
            raise UserChangeError(f"{name} exists already: change its role or password instead")
        return
    current = stored.get(name)
    if current is None:
        raise UserChangeError(f"there is no user {name}")
    if change.action is Action.ROLE and change.role is current:
        raise UserChangeError(f"{name} is already {a_role(current)}")
    losing_admin = current is Role.ADMIN and (
        change.action is Action.REMOVE or change.action is Action.ROLE
    )
    admins = [n for n, role in effective.items() if role is Role.ADMIN]
    if losing_admin and admins == [name]:
        raise UserChangeError(f"{name} is the last admin: make another user an admin first")


def describe(change: UserChange, before: Role | None) -> str:
    """What the audit trail says the change did (no password, no hash)."""
    if change.action is Action.ADD:
        return f"added as {a_role(change.role)}"
    if change.action is Action.REMOVE:
        return f"removed (was {a_role(before)})"
    if change.action is Action.ROLE:
        return f"role changed from {before} to {change.role}"
    return "password reset"


def a_role(role: Role | None) -> str:
    """ "an admin", "an editor", "a viewer"."""
    return f"an {role}" if role is Role.ADMIN or role is Role.EDITOR else f"a {role}"
