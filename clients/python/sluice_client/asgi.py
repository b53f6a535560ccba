"""RateLimitMiddleware: Sluice in front of any ASGI app (Starlette, FastAPI, …), plus the
descriptor sources that read an ASGI scope. Pure ASGI: no web framework is imported.

Allowed requests pass on, with the RateLimit headers added to their response (and, under a
leaky-bucket rule, after waiting their turn). Refused ones are answered 429 with Retry-After,
RateLimit and RateLimit-Policy; 503 when the refusal is the client's ``on_unavailable="deny"``
choice rather than a limit. Only HTTP is limited; websocket and lifespan events pass through.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

from sluice_client.aio import AsyncClient
from sluice_client.headers import rate_limit_headers
from sluice_client.sources import Source, constant, each, nested
from sluice_client.types import Decision, DescriptorLike

__all__ = [
    "RateLimitMiddleware",
    "constant",
    "each",
    "header",
    "method",
    "nested",
    "path",
    "remote_address",
    "user",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
ScopeDescriptors = Callable[[Scope], Sequence[DescriptorLike] | Awaitable[Sequence[DescriptorLike]]]


class RateLimitMiddleware:
    """Checks every HTTP request against Sluice before ``app`` sees it.

    ``descriptors(scope)`` returns the descriptors to check (may be async; [] skips the
    check), e.g. ``remote_address()`` or ``nested(header("x-api-key", key="api_key"),
    path())``. ``add_headers=False`` leaves allowed responses untouched (refusals always carry
    the headers).
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        client: AsyncClient,
        domain: str,
        descriptors: ScopeDescriptors,
        hits: int = 1,
        add_headers: bool = True,
    ) -> None:
        self.app = app
        self._client = client
        self._domain = domain
        self._descriptors = descriptors
        self._hits = hits
        self._add_headers = add_headers

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        produced = self._descriptors(scope)
        if inspect.isawaitable(produced):
            produced = await produced
        if not produced:
            await self.app(scope, receive, send)
            return
        decision = await self._client.check(self._domain, produced, hits=self._hits)
        if not decision.allowed:
            await _refuse(decision, send)
            return
        if decision.delay_s > 0:
            await asyncio.sleep(decision.delay_s)
        headers = rate_limit_headers(decision) if self._add_headers else ()
        if not headers:
            await self.app(scope, receive, send)
            return
        await self.app(scope, receive, _adding_headers(send, headers))


def _encoded(headers: Sequence[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


def _adding_headers(send: Send, headers: tuple[tuple[str, str], ...]) -> Send:
    encoded = _encoded(headers)

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            present = {name.lower() for name, _ in message.get("headers", ())}
            # The app's own values win: it may know better (e.g. a cached response).
            extra = [(k, v) for k, v in encoded if k not in present]
            message = {**message, "headers": [*message.get("headers", ()), *extra]}
        await send(message)

    return wrapped


async def _refuse(decision: Decision, send: Send) -> None:
    if decision.degraded:
        status, body = 503, b"Rate limit service unavailable\n"
    else:
        status, body = 429, b"Too Many Requests\n"
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        *_encoded(rate_limit_headers(decision)),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


# Descriptor sources reading an ASGI scope. Combine them with each() and nested().


def remote_address(*, key: str = "remote_address") -> Source[Scope]:
    """The peer's address, ``scope["client"]`` (behind a proxy, run the server so it sets
    that from X-Forwarded-For, e.g. ``uvicorn --proxy-headers``)."""

    def build(scope: Scope) -> list[dict[str, str]]:
        client = scope.get("client")
        return [{key: str(client[0])}] if client else []

    return build


def header(name: str, *, key: str | None = None) -> Source[Scope]:
    """A request header's (first) value under ``key`` (default: the header name, lowercased)."""
    wanted = name.lower().encode("latin-1")
    entry_key = key or name.lower()

    def build(scope: Scope) -> list[dict[str, str]]:
        for header_name, value in scope.get("headers", ()):
            if header_name.lower() == wanted:
                return [{entry_key: value.decode("latin-1")}]
        return []

    return build


def path(*, key: str = "path") -> Source[Scope]:
    """The request path (without the query string)."""
    return lambda scope: [{key: scope["path"]}]


def method(*, key: str = "method") -> Source[Scope]:
    """The HTTP method."""
    return lambda scope: [{key: scope["method"]}]


def user(
    *, key: str = "user", identity: Callable[[Any], str | None] | None = None
) -> Source[Scope]:
    """The authenticated user, ``scope["user"]`` (set by Starlette's AuthenticationMiddleware
    or similar); none for anonymous requests. ``identity(user)`` names the user (default: its
    ``identity``, else ``display_name``, else ``str(user)``)."""
    name_of = identity or _identity

    def build(scope: Scope) -> list[dict[str, str]]:
        who = scope.get("user")
        if who is None or not getattr(who, "is_authenticated", True):
            return []
        name = name_of(who)
        return [{key: name}] if name else []

    return build


def _identity(user: Any) -> str | None:
    for attribute in ("identity", "display_name"):
        try:
            value = getattr(user, attribute, None)
        except NotImplementedError:  # Starlette's BaseUser leaves these abstract
            continue
        if value:
            return str(value)
    return str(user) if isinstance(user, str) else None
