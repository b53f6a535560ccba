"""What ``sluice admin`` serves: the admin app (``app.py``) as an ``st.App``, with the one
Streamlit endpoint that answers without sign-in and that nothing here uses closed.

``/_stcore/metrics`` shows Streamlit's internal counters (sessions, cache sizes) to anyone
who can reach the port, and Streamlit has no setting to turn it off; a middleware answers it
404. ``/_stcore/health`` and ``/_stcore/host-config`` stay: the browser asks both before it
can show the sign-in form.
"""

from __future__ import annotations

from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from streamlit import App

from sluice_admin import APP_PATH

__all__ = ["CLOSED_PATHS", "ClosedPaths", "app"]

CLOSED_PATHS = frozenset({"/_stcore/metrics"})


class ClosedPaths:
    """Answers 404 to the HTTP paths in ``CLOSED_PATHS`` before Streamlit sees them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"].rstrip("/") in CLOSED_PATHS:
            await PlainTextResponse("Not Found", status_code=404)(scope, receive, send)
            return
        await self.app(scope, receive, send)


app = App(APP_PATH, middleware=[Middleware(ClosedPaths)])
