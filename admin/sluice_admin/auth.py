"""Who may use the admin app: password hashes, user lists, and throttled sign-in.

Pure Python (no Streamlit, no database): the app and ``sluice admin-user`` both use it.
Hashes are scrypt with a per-user salt, encoded as ``scrypt$n$r$p$salt$hash`` (hex), so the
cost can be raised later without invalidating stored hashes. Sign-in attempts are rate
limited by Sluice itself (throttle.py).
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass

from sluice_admin.throttle import SignInLimiter

log = logging.getLogger(__name__)

__all__ = [
    "Role",
    "User",
    "hash_password",
    "parse_users",
    "verify_password",
]

# scrypt cost: ~50 ms and 16 MiB per check; slow enough to make offline guessing expensive.
_N, _R, _P = 2**14, 8, 1
_SALT_BYTES = 16
_KEY_BYTES = 32
_MAXMEM = 64 * 1024 * 1024


class Role(enum.StrEnum):
    VIEWER = "viewer"  # reads every page
    EDITOR = "editor"  # also changes policies, pins and resets
    ADMIN = "admin"  # also manages the app's users


@dataclass(frozen=True)
class User:
    name: str
    role: Role

    @property
    def can_edit(self) -> bool:
        return self.role in (Role.EDITOR, Role.ADMIN)

    @property
    def can_manage_users(self) -> bool:
        return self.role is Role.ADMIN


@dataclass(frozen=True)
class Account:
    """A user as stored: name, role and password hash."""

    name: str
    role: Role
    password_hash: str


def hash_password(password: str, *, n: int = _N, r: int = _R, p: int = _P) -> str:
    salt = secrets.token_bytes(_SALT_BYTES)
    key = hashlib.scrypt(
        password.encode(), salt=salt, n=n, r=r, p=p, dklen=_KEY_BYTES, maxmem=_MAXMEM
    )
    return f"scrypt${n}${r}${p}${salt.hex()}${key.hex()}"


def verify_password(password: str, encoded: str) -> bool:
    """True iff ``password`` matches ``encoded``; a malformed hash never matches."""
    try:
        scheme, n, r, p, salt, key = encoded.split("$")
        if scheme != "scrypt":
            return False
        expected = bytes.fromhex(key)
        actual = hashlib.scrypt(
            password.encode(),
            salt=bytes.fromhex(salt),
            n=int(n),
            r=int(r),
            p=int(p),
            dklen=len(expected),
            maxmem=_MAXMEM,
        )
    except ValueError:
        return False
    return hmac.compare_digest(actual, expected)


# Checked against when the user name is unknown, so a wrong name costs as long as a wrong
# password and the answer time does not reveal which names exist.
_DUMMY_HASH = hash_password(secrets.token_hex(8))


def check_credentials(accounts: dict[str, Account], name: str, password: str) -> User | None:
    account = accounts.get(name)
    if account is None:
        verify_password(password, _DUMMY_HASH)
        return None
    if not verify_password(password, account.password_hash):
        return None
    return User(account.name, account.role)


def parse_users(text: str) -> dict[str, Account]:
    """Accounts from the ``--admin-users`` setting: ``NAME:ROLE:HASH,…``; ValueError names
    the bad entry (by position, never echoing the hash)."""
    accounts: dict[str, Account] = {}
    for index, entry in enumerate(e.strip() for e in text.split(",")):
        if not entry:
            continue
        parts = entry.split(":")
        if len(parts) != 3 or not parts[0] or not parts[2].startswith("scrypt$"):
            raise ValueError(f"SLUICE_ADMIN_USERS entry {index + 1}: expected NAME:ROLE:HASH")
        name, role, password_hash = parts
        try:
            accounts[name] = Account(name, Role(role), password_hash)
        except ValueError:
            raise ValueError(
                f"SLUICE_ADMIN_USERS entry {index + 1}: role must be viewer, editor or admin"
            ) from None
    return accounts


MAX_NAME_LENGTH = 255  # what `sluice admin-user add` accepts


def sign_in(
    accounts: dict[str, Account],
    limiter: SignInLimiter,
    name: str,
    password: str,
    address: str | None = None,
) -> User | None:
    """The user, or None for a wrong name or password; SignInRefused when there were too many
    attempts (for the name, from the address, or failures overall), SignInUnavailable when the
    limiter cannot tell. Failures are logged with the client's address."""
    if not name or len(name) > MAX_NAME_LENGTH:
        return None  # no such user can exist: neither counted nor hashed
    limiter.attempt(name, address)  # before the hash: a throttled attempt costs no scrypt
    user = check_credentials(accounts, name, password)
    if user is None:
        limiter.failed()
        log.warning("sign-in failed for %r from %s", name, address or "an unknown address")
    return user
