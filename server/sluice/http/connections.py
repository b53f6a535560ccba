"""Bounds on the connections of an aiohttp port: how long a request's headers may take to
arrive, and how many idle connections are kept.

Header read time: aiohttp's keep-alive timer (``keepalive_timeout``) starts when a connection
opens and again after each answer, and bytes that do not complete a request's headers do not
restart it; when it fires on a connection still waiting for a whole request, aiohttp closes
it. So ``keepalive_timeout`` bounds the time a client may take to send its headers, however
it trickles them, as well as how long an idle keep-alive connection is kept (aiohttp's
default is an hour).

Idle connections: aiohttp keeps any number. :class:`IdleConnections` counts the connections
with no request being answered (one still sending its headers counts as idle) and, past its
maximum, closes the one idle longest when another opens. A flood of slow or silent
connections then displaces its own oldest members instead of piling up until the timeout,
and a request being answered is never cut off. A client whose idle keep-alive connection is
closed this way opens another, as it would after the idle timeout.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.web_protocol import RequestHandler

__all__ = ["BoundedRunner", "IdleConnections"]

_Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class BoundedRunner(web.AppRunner):
    """An ``AppRunner`` whose connections must send a whole request's headers within
    ``idle_timeout_s`` of opening or of their last answer, and of which at most
    ``max_idle_connections`` are kept idle."""

    def __init__(
        self,
        app: web.Application,
        *,
        idle_timeout_s: float,
        max_idle_connections: int,
        **kwargs: Any,
    ) -> None:
        self.idle_connections = IdleConnections(max_idle_connections)
        app.middlewares.append(self.idle_connections.middleware)
        super().__init__(app, keepalive_timeout=idle_timeout_s, **kwargs)

    async def setup(self) -> None:
        await super().setup()
        assert self.server is not None  # set up just now
        self.idle_connections.install(self.server)


class IdleConnections:
    """Keeps at most ``max_idle`` idle connections on one aiohttp server.

    ``middleware`` goes on the application (it sees when a connection starts and stops
    answering a request); ``install`` on the runner's server once set up (it sees
    connections open and close: aiohttp offers no other hook for that). ``BoundedRunner``
    does both.
    """

    def __init__(self, max_idle: int) -> None:
        if max_idle < 1:
            raise ValueError("max_idle must be at least 1")
        self.max_idle = max_idle
        self._idle: OrderedDict[RequestHandler, None] = OrderedDict()  # longest idle first
        self._busy: set[RequestHandler] = set()
        self.closed = 0  # idle connections closed to make room

    @property
    def idle(self) -> int:
        return len(self._idle)

    def install(self, server: web.Server) -> None:
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: RequestHandler, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._idle[handler] = None
            while len(self._idle) > self.max_idle:
                oldest, _ = self._idle.popitem(last=False)
                oldest.force_close()
                self.closed += 1

        def connection_lost(handler: RequestHandler, exc: BaseException | None = None) -> None:
            lost(handler, exc)
            self._idle.pop(handler, None)
            self._busy.discard(handler)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    @web.middleware
    async def middleware(self, request: web.Request, handler: _Handler) -> web.StreamResponse:
        connection = request.protocol
        if not isinstance(connection, RequestHandler):  # a test client's mock
            return await handler(request)
        self._idle.pop(connection, None)
        self._busy.add(connection)
        try:
            return await handler(request)
        finally:
            # Idle again, the most recently so, unless it closed meanwhile.
            if connection in self._busy:
                self._busy.discard(connection)
                self._idle[connection] = None
