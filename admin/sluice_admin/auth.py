"""Who may use the admin app: password hashes, user lists, and throttled sign-in.

Pure Python (no Streamlit, no database): the app and ``sluice admin-user`` both use it.
Hashes are scrypt with a per-user salt, encoded as ``scrypt$n$r$p$salt$hash`` (hex), so the
cost can be raised later without invalidating stored hashes. Failed sign-ins are limited
with Sluice's own GCRA step function, keyed by user name.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import math
import secrets
import threading
from dataclasses import dataclass

from sluice.algorithms import Limit, gcra

__all__ = [
    "Role",
    "SignInLimiter",
    "SignInRefused",
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
    VIEWER = "viewer"
    EDITOR = "editor"


@dataclass(frozen=True)
class User:
    name: str
    role: Role

    @property
    def can_edit(self) -> bool:
        return self.role is Role.EDITOR


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
                f"SLUICE_ADMIN_USERS entry {index + 1}: role must be viewer or editor"
            ) from None
    return accounts


class SignInRefused(Exception):
    """Too many failed sign-ins for this name; ``retry_after_s`` says when to try again."""

    def __init__(self, name: str, retry_after_s: float) -> None:
        super().__init__(name, retry_after_s)
        self.name = name
        self.retry_after_s = retry_after_s

    def __str__(self) -> str:
        seconds = max(1, math.ceil(self.retry_after_s))
        return f"Too many failed sign-ins for '{self.name}'. Try again in {seconds} s."


# 5 failures a minute, in a burst of at most 5: a typo or two never locks anyone out, a
# guessing script gets five tries a minute.
FAILURE_LIMIT = Limit(requests_per_unit=5, period_s=60, algorithm="gcra", burst=5)


class SignInLimiter:
    """Failed sign-ins per user name, counted by the gcra step function.

    One instance per app process (shared by every browser session), so opening a new tab
    does not reset the count. The state is one float per name that failed recently.
    """

    def __init__(self, limit: Limit = FAILURE_LIMIT) -> None:
        self._limit = limit
        self._states: dict[str, gcra.GcraState] = {}
        self._lock = threading.Lock()

    def check(self, name: str, now: float) -> None:
        """Raise SignInRefused if one more failure would not be admitted now."""
        with self._lock:
            _, outcome = gcra.step(self._states.get(name), self._limit, now, 1)
        if not outcome.allowed:
            raise SignInRefused(name, outcome.reset_s)

    def failed(self, name: str, now: float) -> None:
        with self._lock:
            state, _ = gcra.step(self._states.get(name), self._limit, now, 1)
            self._states[name] = state
            # Forget names whose failures have all expired, so guessed names cannot pile up.
            for stale in [
                k for k, s in self._states.items() if gcra.expires_at(s, self._limit) < now
            ]:
                del self._states[stale]


def sign_in(
    accounts: dict[str, Account], limiter: SignInLimiter, name: str, password: str, now: float
) -> User | None:
    """The user, or None for a wrong name or password; SignInRefused when throttled."""
    limiter.check(name, now)  # before the hash: a throttled name costs no scrypt either
    user = check_credentials(accounts, name, password)
    if user is None:
        limiter.failed(name, now)
    return user
