"""Streamlit glue shared by every page: settings, the database handle, the signed-in user,
the chosen domain, and turning expected failures into messages instead of tracebacks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import streamlit as st

from sluice.clock import Clock, SystemClock
from sluice.errors import ConfigDatabaseError, SluiceError
from sluice.settings import Settings, from_arguments
from sluice_admin.auth import User, parse_users, sign_in
from sluice_admin.data import AdminData
from sluice_admin.throttle import SignInLimiter, SignInRefused, SignInUnavailable

__all__ = [
    "CLOCK",
    "choose_domain",
    "clock",
    "current_user",
    "escape",
    "data",
    "guarded",
    "settings",
    "sign_in_as",
    "sign_out",
    "user",
]

_USER = "sluice_user"
DOMAIN = "sluice_domain"
# Session state key of the pages' clock when it is not the system's: tests put a ManualClock
# there (AppTest's session_state), so figures seeded at fixed times stay in their windows
# however long a run takes. No widget has this key, so no browser can set it.
CLOCK = "sluice_clock"
_SYSTEM_CLOCK = SystemClock()


def clock() -> Clock:
    """What the pages read the time from: the system's clock unless the session holds one."""
    found = st.session_state.get(CLOCK)
    return found if found is not None else _SYSTEM_CLOCK


def settings() -> Settings:
    # Read on every run (cheap) so a test or a restart with new variables is seen at once.
    return from_arguments(None)


@st.cache_resource(show_spinner=False)
def _open(url: str, max_log_limit: int) -> AdminData:
    # Cached per process: every session shares one connection pool. A failure is not
    # cached, so the next run tries again once the database is back.
    return AdminData.open(url, max_log_limit=max_log_limit)


@st.cache_resource(show_spinner=False)
def _limiter(database_url: str, _settings: Settings) -> SignInLimiter:
    # One per process and config database (all browser sessions): a new tab does not reset
    # it. With the Redis backend every admin replica shares the counts too.
    from sluice.app import make_backend

    return SignInLimiter(make_backend(_settings) if _settings.backend == "redis" else None)


def data() -> AdminData:
    """The database handle; if the database cannot be reached, say so and stop the page."""
    s = settings()
    try:
        with st.spinner("Connecting to the config database…"):
            return _open(s.database_url, s.max_sliding_log_limit)
    except ConfigDatabaseError as exc:
        st.error(f"The config database cannot be reached, so nothing can be shown.\n\n{exc}")
        st.stop()
        raise  # unreachable: st.stop() raises


@contextmanager
def guarded() -> Iterator[None]:
    """Show a failure of the database or a refused change as a message, not a traceback."""
    try:
        yield
    except ConfigDatabaseError as exc:
        st.error(f"The config database cannot be reached right now.\n\n{exc}")
    except SluiceError as exc:
        st.error(str(exc))


def user() -> User | None:
    return st.session_state.get(_USER)


def current_user() -> User:
    """The signed-in user; pages only run after sign-in (see app.py)."""
    signed_in = user()
    if signed_in is None:
        st.stop()
    assert signed_in is not None
    return signed_in


def sign_in_as(name: str, password: str) -> str | None:
    """Sign in; None on success, else the message to show."""
    s = settings()
    try:
        accounts = {**data().accounts(), **parse_users(s.admin_users)}
    except ValueError as exc:
        return f"The admin users setting is invalid: {exc}"
    if not accounts:
        return (
            "No admin users exist yet. Create one with "
            "`sluice admin-user add NAME --role editor` (or set SLUICE_ADMIN_USERS)."
        )
    try:
        # The address Streamlit saw (None for localhost); behind a proxy it is the proxy's.
        # Anything but text (Streamlit's test harness has a mock there) counts as unknown: the
        # limiter, compiled, takes descriptor values as str only.
        seen = st.context.ip_address
        address = seen if isinstance(seen, str) else None
        signed_in = sign_in(accounts, _limiter(s.database_url, s), name, password, address)
    except (SignInRefused, SignInUnavailable) as exc:
        return str(exc)
    if signed_in is None:
        return "Wrong user name or password."
    st.session_state[_USER] = signed_in
    return None


def sign_out() -> None:
    for key in list(st.session_state.keys()):
        del st.session_state[key]


def choose_domain(domains: list[str]) -> str | None:
    """The domain the pages show, picked in the sidebar and kept across pages."""
    if not domains:
        return None
    current = st.session_state.get(DOMAIN)
    index = domains.index(current) if current in domains else 0
    chosen = st.sidebar.selectbox("Domain", domains, index=index)
    st.session_state[DOMAIN] = chosen
    return chosen


_MARKDOWN = set("\\`*_{}[]()<>#+-.!|~:$")


def escape(text: str) -> str:
    """``text`` for a Markdown-rendering element (alerts, captions) shown literally: rule keys
    and values are user-written and may contain ``*``, ``_`` or ``[``."""
    return "".join("\\" + c if c in _MARKDOWN else c for c in text)
