"""What ``sluice admin`` serves: the admin app (``app.py``) as an ``st.App``, with the two
routes that set and clear the session cookie, single sign-on's secrets when it is
configured, and the one Streamlit endpoint that answers without sign-in and that nothing
here uses closed.

The pages run over a WebSocket, which cannot set a cookie, let alone an HttpOnly one. So a
sign-in ends by sending the browser to ``/_sluice/session?ticket=…&next=/page``: the route
trades the one-time ticket (session_store.py) for the session cookie and sends the browser
on to the page. ``/_sluice/sign-out`` drops the cookie (the session itself was ended by the
page, in every browser).

``/_stcore/metrics`` shows Streamlit's internal counters (sessions, cache sizes) to anyone
who can reach the port, and Streamlit has no setting to turn it off; a middleware answers it
404. ``/_stcore/health`` and ``/_stcore/host-config`` stay: the browser asks both before it
can show the sign-in form.
"""

from __future__ import annotations

import hashlib
import hmac
import threading
import time
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send
from streamlit import App

from sluice.settings import Settings, from_arguments
from sluice_admin import APP_PATH, oidc
from sluice_admin.data import AdminData
from sluice_admin.session_cookie import (
    SIGN_OUT_PATH,
    TICKET_PATH,
    cookie_header,
    expired_cookie_header,
    seal,
)

__all__ = ["CLOSED_PATHS", "ClosedPaths", "app", "local_path"]

CLOSED_PATHS = frozenset({"/_stcore/metrics"})
_STREAMLIT_LOGOUT = "/auth/logout"  # Streamlit's: drops its single sign-on cookie


class ClosedPaths:
    """Answers 404 to the HTTP paths in ``CLOSED_PATHS`` before Streamlit sees them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") in CLOSED_PATHS:
            await PlainTextResponse("Not Found", status_code=404)(scope, receive, send)
            return
        await self.app(scope, receive, send)


def local_path(target: str | None) -> str:
    """``target`` if it is a path on this app, else ``/``: the ``next`` of a sign-in must not
    send the browser to another site."""
    if not target or not target.startswith("/") or target.startswith("//"):
        return "/"
    # Browsers read a backslash as a slash and drop tabs and newlines: "/\\evil.example" and
    # "/\t/evil.example" would leave the app.
    if "\\" in target or any(c.isspace() or ord(c) < 32 for c in target):
        return "/"
    return target


class _Sessions:
    """The config database as the routes need it: opened on first use, shared by them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._data: AdminData | None = None
        self._key: bytes | None = None

    def open(self) -> tuple[AdminData, bytes]:
        with self._lock:
            if self._data is None or self._key is None:
                s = from_arguments(None)
                self._data = AdminData.open(s.database_url)
                self._key = signing_key(s, self._data)
            return self._data, self._key

    def trade(self, ticket: str) -> tuple[str, int] | None:
        """The cookie's value and max-age for a sign-in ticket, or None."""
        data, key = self.open()
        now_s = time.time()
        traded = data.sessions.redeem(ticket, now_s=now_s)
        if traded is None:
            return None
        cookie, expires_s = traded
        return seal(cookie, expires_s, key), int(expires_s - now_s)


def signing_key(s: Settings, data: AdminData) -> bytes:
    """The cookie's signing key: the setting, else the one kept in the config database."""
    return (s.admin_session_secret or data.sessions.signing_key(now_s=time.time())).encode()


_SESSIONS = _Sessions()


def _from_another_site(request: Request) -> bool:
    """Whether the browser says another site started this request (Sec-Fetch-Site; a client
    that sends none is taken at its word)."""
    return request.headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none")


async def trade_ticket(request: Request) -> Response:
    # Only the app's own pages send the browser here: a link on another site must not sign
    # its visitor in as someone else.
    if _from_another_site(request):
        return PlainTextResponse("Sign-in links work only from the admin app itself.", 403)
    ticket = request.query_params.get("ticket", "")
    traded = await run_in_threadpool(_SESSIONS.trade, ticket) if ticket else None
    if traded is None:
        return RedirectResponse("/", status_code=303)  # the sign-in page again
    value, max_age_s = traded
    response = RedirectResponse(local_path(request.query_params.get("next")), status_code=303)
    secure = request.url.scheme == "https"
    response.headers.append("set-cookie", cookie_header(value, max_age_s=max_age_s, secure=secure))
    response.headers["cache-control"] = "no-store"
    response.headers["referrer-policy"] = "no-referrer"  # the ticket stays out of Referer
    return response


async def sign_out(request: Request) -> Response:
    if _from_another_site(request):  # nor drop the cookie of someone who followed a link
        return PlainTextResponse("Sign-out works only from the admin app itself.", 403)
    target = _STREAMLIT_LOGOUT if request.query_params.get("sso") else "/"
    response = RedirectResponse(target, status_code=303)
    secure = request.url.scheme == "https"
    response.headers.append("set-cookie", expired_cookie_header(secure=secure))
    return response


def _secrets() -> dict[str, Any] | None:
    """Streamlit's ``[auth]`` secrets when single sign-on is configured (else None). Its
    cookie secret is derived from the session signing key, so it needs no setting of its own."""
    config = oidc.oidc_config(from_arguments(None))
    if config is None:
        return None
    _, key = _SESSIONS.open()
    cookie_secret = hmac.new(key, b"streamlit auth cookie", hashlib.sha256).hexdigest()
    return oidc.streamlit_secrets(config, cookie_secret)


app = App(
    APP_PATH,
    secrets=_secrets(),
    routes=[
        Route(TICKET_PATH, trade_ticket, methods=["GET"]),
        Route(SIGN_OUT_PATH, sign_out, methods=["GET"]),
    ],
    middleware=[Middleware(ClosedPaths)],
)
