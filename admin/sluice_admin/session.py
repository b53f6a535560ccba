"""Streamlit glue shared by every page: settings, the database handle, the signed-in user
and their session, the chosen domain, and turning expected failures into messages instead of
tracebacks.

A session lives in the config database (session_store.py); the browser holds it in an
HttpOnly cookie (session_cookie.py) that only served.py's routes set and clear, since a page
runs over a WebSocket and cannot. Every run of the app checks the session's row, so a sign-out
in one tab or browser, the idle timeout and the lifetime end it in all of them.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import streamlit as st

from sluice.clock import Clock, SystemClock
from sluice.errors import ConfigDatabaseError, SluiceError
from sluice.settings import Settings, from_arguments
from sluice_admin import oidc
from sluice_admin.auth import User, parse_users, sign_in
from sluice_admin.data import AdminData
from sluice_admin.session_cookie import COOKIE_NAME, SIGN_OUT_PATH, TICKET_PATH, unseal
from sluice_admin.session_store import Ended, SessionRow, verdict
from sluice_admin.throttle import SignInLimiter, SignInRefused, SignInUnavailable

__all__ = [
    "CLOCK",
    "authenticate",
    "choose_domain",
    "clock",
    "current_user",
    "data",
    "ended_notice",
    "escape",
    "guarded",
    "settings",
    "send_redirect",
    "show_domain",
    "sign_in_as",
    "sign_in_sso",
    "sign_out",
    "sso_config",
    "still_signed_in",
    "user",
]

_SIGNED_IN = "sluice_signed_in"
_ENDED = "sluice_session_ended"
_REDIRECT = "sluice_redirect"
DOMAIN = "sluice_domain"
_DOMAIN_PICKER = "sluice_domain_picker"
_DOMAIN_PAGE = "sluice_domain_page"  # the page the picker was last drawn on
# Session state key of the pages' clock when it is not the system's: tests put a ManualClock
# there (AppTest's session_state), so figures seeded at fixed times stay in their windows
# however long a run takes. No widget has this key, so no browser can set it.
CLOCK = "sluice_clock"
_SYSTEM_CLOCK = SystemClock()
# Longest a session's last action may be noted late (fewer writes than one per click); the
# idle timeout counts from the note, so it may end a session up to this much early.
_TOUCH_EVERY_S = 60.0


@dataclass(frozen=True)
class SignedIn:
    """This browser session's sign-in: which stored session, whose."""

    session_id: str
    user: User
    sso: bool


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


@st.cache_resource(show_spinner=False)
def _stored_key(database_url: str) -> str:
    # Read (or made) once per process and database; it never changes once made.
    return data().sessions.signing_key(now_s=clock().now())


def _key(s: Settings) -> bytes:
    return s.admin_session_secret.encode() or _stored_key(s.database_url).encode()


# -- the signed-in user ------------------------------------------------------------------------


def user() -> User | None:
    signed_in: SignedIn | None = st.session_state.get(_SIGNED_IN)
    return signed_in.user if signed_in is not None else None


def current_user() -> User:
    """The signed-in user; pages only run after sign-in (see app.py)."""
    signed_in = user()
    if signed_in is None:
        st.stop()
    assert signed_in is not None
    return signed_in


def authenticate(*, active: bool = True) -> User | None:
    """The signed-in user for this run, from this browser session or, after a reload or in a
    new tab, from the cookie; None, with the reason kept for the sign-in page, once the
    session has ended (signed out anywhere, idle, or past its lifetime). ``active``: this run
    is the user's doing (it counts against the idle timeout); a page refreshing itself is not.
    """
    signed_in: SignedIn | None = st.session_state.get(_SIGNED_IN)
    cookie = st.context.cookies.get(COOKIE_NAME) if signed_in is None else None
    if signed_in is None and not isinstance(cookie, str):
        return None  # (the sign-in form shows without the database)
    s = settings()
    store = data().sessions
    now_s = clock().now()
    row: SessionRow | None
    if signed_in is not None:
        row = store.get(signed_in.session_id)
    else:
        assert isinstance(cookie, str)
        sealed = unseal(cookie, _key(s), now_s)
        row = store.by_cookie(sealed) if sealed is not None else None
        if row is None:
            return None
    why = verdict(row, now_s, s.admin_session_idle_timeout_s) if row else Ended.SIGNED_OUT
    user_now = _as_now(row, s) if row is not None and why is None else None
    if why is None and user_now is None:
        why = Ended.REMOVED
    if why is not None:
        if row is not None and row.ended is None:
            store.end(row.session_id, why, now_s=now_s)
        if signed_in is not None:
            _forget()  # (not for a stale cookie: that would empty the sign-in form each run)
        st.session_state[_ENDED] = why
        return None
    assert row is not None and user_now is not None
    idle = s.admin_session_idle_timeout_s
    touch_every = min(_TOUCH_EVERY_S, idle / 10) if idle > 0 else _TOUCH_EVERY_S
    if active and now_s - row.last_seen_s >= touch_every:
        store.touch(row.session_id, now_s=now_s)
    st.session_state[_SIGNED_IN] = SignedIn(row.session_id, user_now, row.sso)
    return user_now


def _as_now(row: SessionRow, s: Settings) -> User | None:
    """The session's user with their role as it is now (an admin may have changed it), or
    None once the account is gone. A single sign-on user's role is the one the provider's
    answer gave at sign-in."""
    if row.sso:
        return row.user
    try:
        accounts = {**data().accounts(), **parse_users(s.admin_users)}
    except ValueError:
        return row.user  # a bad users setting: the sign-in form says so
    account = accounts.get(row.user.name)
    return User(account.name, account.role) if account is not None else None


def still_signed_in() -> None:
    """For a page part that refreshes itself (a fragment): if the session has ended, rerun
    the whole app, which then shows the sign-in page."""
    if authenticate(active=False) is None:
        st.rerun(scope="app")


def ended_notice() -> str | None:
    """Why the last session of this browser ended, in words, or None."""
    why: Ended | None = st.session_state.get(_ENDED)
    if why is None:
        return None
    s = settings()
    if why is Ended.IDLE:
        idle = _in_words(s.admin_session_idle_timeout_s)
        return f"You were signed out after {idle} without activity. Sign in again."
    if why is Ended.REMOVED:
        return "You were signed out: your account no longer exists here."
    if why is Ended.EXPIRED:
        lifetime = _in_words(s.admin_session_lifetime_s)
        return f"Your session reached its limit of {lifetime}. Sign in again."
    return "You were signed out (here or in another tab or browser)."


def _in_words(seconds: float) -> str:
    for unit, size in (("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{seconds:g} second{'s' if seconds != 1 else ''}"


def _forget() -> None:
    """Drop everything this browser session holds but the test clock and a redirect to send."""
    for key in list(st.session_state.keys()):
        if key not in (CLOCK, _REDIRECT):
            del st.session_state[key]


def _redirect(url: str) -> None:
    """Have the browser go to ``url`` (one of served.py's routes, which set or clear the
    cookie) at the end of the next run: a message sent now would be dropped by the rerun
    that follows a sign-in or a sign-out (Streamlit clears what a run sent when it reruns)."""
    st.session_state[_REDIRECT] = url


def send_redirect() -> None:
    """Send the redirect a sign-in or sign-out asked for, if any: Streamlit's own message
    for st.login's redirect, which the page follows with a plain navigation. app.py calls
    it once per run."""
    url = st.session_state.pop(_REDIRECT, None)
    if url is None:
        return
    from streamlit.proto.ForwardMsg_pb2 import ForwardMsg
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx = get_script_run_ctx()
    if ctx is None:
        return
    message = ForwardMsg()
    message.auth_redirect.url = url
    ctx.enqueue(message)


def _here() -> str:
    """The path the browser shows (a deep link's page), to come back to after sign-in."""
    url = st.context.url
    path = urllib.parse.urlsplit(url).path if isinstance(url, str) else ""
    return path or "/"


def _start(signed_in: User, identity: str | None = None) -> None:
    s = settings()
    session_id, ticket = data().sessions.start(
        signed_in,
        now_s=clock().now(),
        lifetime_s=s.admin_session_lifetime_s,
        identity=identity,
    )
    _forget()
    st.session_state[_SIGNED_IN] = SignedIn(session_id, signed_in, identity is not None)
    query = urllib.parse.urlencode({"ticket": ticket, "next": _here()})
    _redirect(f"{TICKET_PATH}?{query}")


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
    _start(signed_in)
    return None


def sso_config() -> oidc.OidcConfig | None:
    """Single sign-on as configured (None: off); ValueError says what is wrong."""
    return oidc.oidc_config(settings())


def sign_in_sso(claims: Mapping[str, object], config: oidc.OidcConfig) -> str | None:
    """Start a session from the identity provider's fresh answer (``st.user``); None on
    success, else the message to show. A stale or already used answer (Streamlit keeps it
    in a cookie for 30 days) starts nothing: the user signs in with the provider again."""
    now_s = clock().now()
    name = oidc.user_name(claims)
    if name is None or not oidc.is_fresh(claims, now_s):
        return ""
    mark = oidc.identity(claims)
    if data().sessions.identity_used(mark):
        return ""
    role = oidc.role_for(claims, config)
    if role is None:
        return (
            f"{name} signed in with single sign-on, but has no role in this admin app: "
            f"the '{config.role_claim}' claim names no group that is given one. Ask an "
            "administrator to add you to one."
        )
    _start(User(name, role), identity=mark)
    return None


def sign_out() -> None:
    """End every session of the signed-in user (all tabs and browsers), then have the
    browser drop its cookie (and, after single sign-on, Streamlit's too)."""
    signed_in: SignedIn | None = st.session_state.get(_SIGNED_IN)
    if signed_in is not None:
        data().sessions.end_user(signed_in.user.name, Ended.SIGNED_OUT, now_s=clock().now())
    _forget()
    _redirect(SIGN_OUT_PATH + ("?sso=1" if signed_in is not None and signed_in.sso else ""))


def choose_domain(domains: list[str]) -> str | None:
    """The domain the pages show, picked in the sidebar and kept across pages."""
    if not domains:
        return None
    # A keyed widget, seeded from the kept choice: without a key, the widget was a new one
    # whenever its index changed, and every other pick was lost. The widget is a new one on
    # each page too (Streamlit tells widgets apart by page), so it is seeded again there.
    from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

    ctx = get_script_run_ctx()
    page = ctx.page_script_hash if ctx is not None else ""
    if (
        st.session_state.get(_DOMAIN_PICKER) not in domains
        or st.session_state.get(_DOMAIN_PAGE) != page
    ):
        current = st.session_state.get(DOMAIN)
        st.session_state[_DOMAIN_PICKER] = current if current in domains else domains[0]
        st.session_state[_DOMAIN_PAGE] = page
    chosen: str = st.sidebar.selectbox("Domain", domains, key=_DOMAIN_PICKER)
    st.session_state[DOMAIN] = chosen
    return chosen


def show_domain(domain: str) -> None:
    """Make ``domain`` the chosen one (the sidebar shows it at the next run)."""
    st.session_state[DOMAIN] = domain
    st.session_state.pop(_DOMAIN_PAGE, None)


_MARKDOWN = set("\\`*_{}[]()<>#+-.!|~:$")


def escape(text: str) -> str:
    """``text`` for a Markdown-rendering element (alerts, captions) shown literally: rule keys
    and values are user-written and may contain ``*``, ``_`` or ``[``."""
    return "".join("\\" + c if c in _MARKDOWN else c for c in text)
