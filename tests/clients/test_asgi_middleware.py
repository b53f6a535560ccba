"""RateLimitMiddleware in a real Starlette app, served by a real uvicorn, called over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from sluice_client import AsyncClient
from sluice_client.asgi import (
    RateLimitMiddleware,
    constant,
    each,
    header,
    method,
    nested,
    path,
    remote_address,
    user,
)
from tests.support.processes import SluiceProcess, free_port, wait_until


def build_app(client: AsyncClient, domain: str) -> Starlette:
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.close()

    return Starlette(
        routes=[Route("/hello", hello)],
        middleware=[
            Middleware(
                RateLimitMiddleware,
                client=client,
                domain=domain,
                # Requests without the header are not limited at all.
                descriptors=header("X-Client", key="client"),
            )
        ],
        lifespan=lifespan,
    )


@contextlib.contextmanager
def serve(app: Any) -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, 10, "uvicorn")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


@pytest.fixture(scope="module")
def app_url(sluice: SluiceProcess) -> Iterator[str]:
    with serve(build_app(AsyncClient(sluice.grpc_target), "clients")) as url:
        yield url


def test_allowed_requests_carry_ratelimit_headers_then_429(app_url: str, unique: str) -> None:
    with httpx.Client(base_url=app_url, headers={"X-Client": unique}) as http:
        first, second, third = (http.get("/hello") for _ in range(3))

    assert first.status_code == second.status_code == 200
    assert first.text == "hello"
    assert first.headers["ratelimit-policy"] == '"per-client";q=2;w=3600'
    assert first.headers["ratelimit"].startswith('"per-client";r=1;t=')
    assert second.headers["ratelimit"].startswith('"per-client";r=0;t=')
    assert "retry-after" not in first.headers

    assert third.status_code == 429
    assert third.text == "Too Many Requests\n"
    assert 0 < int(third.headers["retry-after"]) <= 3600
    assert third.headers["ratelimit"].startswith('"per-client";r=0;t=')
    assert third.headers["ratelimit-policy"] == '"per-client";q=2;w=3600'


def test_requests_without_descriptors_are_not_checked(app_url: str) -> None:
    with httpx.Client(base_url=app_url) as http:
        responses = [http.get("/hello") for _ in range(4)]
    assert [r.status_code for r in responses] == [200] * 4
    assert "ratelimit" not in responses[0].headers


def test_sluice_down_under_deny_answers_503(unreachable_target: str) -> None:
    client = AsyncClient(unreachable_target, on_unavailable="deny")
    with serve(build_app(client, "clients")) as url:
        response = httpx.get(url + "/hello", headers={"X-Client": "x"})
    assert response.status_code == 503
    assert "retry-after" not in response.headers


# Descriptor sources, on plain scopes.

SCOPE = {
    "type": "http",
    "method": "GET",
    "path": "/items/7",
    "headers": [(b"x-api-key", b"k1"), (b"x-api-key", b"k2")],
    "client": ("192.0.2.1", 50000),
}


class StarletteLikeUser:
    is_authenticated = True
    display_name = "alice"

    @property
    def identity(self) -> str:
        raise NotImplementedError


class Anonymous:
    is_authenticated = False


def test_scope_sources() -> None:
    assert remote_address()(SCOPE) == [{"remote_address": "192.0.2.1"}]
    assert remote_address()({**SCOPE, "client": None}) == []
    assert header("X-Api-Key", key="api_key")(SCOPE) == [{"api_key": "k1"}]
    assert header("x-missing")(SCOPE) == []
    assert path()(SCOPE) == [{"path": "/items/7"}]
    assert method()(SCOPE) == [{"method": "GET"}]
    assert user()({**SCOPE, "user": StarletteLikeUser()}) == [{"user": "alice"}]
    assert user()({**SCOPE, "user": Anonymous()}) == []
    assert user(identity=lambda u: "id-9")({**SCOPE, "user": StarletteLikeUser()}) == [
        {"user": "id-9"}
    ]


def test_combinators() -> None:
    both = each(remote_address(), nested(constant("route", "items"), header("x-api-key")))
    assert both(SCOPE) == [
        {"remote_address": "192.0.2.1"},
        {"route": "items", "x-api-key": "k1"},
    ]
    assert list(both(SCOPE)[1]) == ["route", "x-api-key"]  # entries keep their order
    assert nested(path(), header("x-missing"))(SCOPE) == []  # Envoy drops partial descriptors


def test_non_http_scopes_pass_through_untouched() -> None:
    seen: list[str] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        seen.append(scope["type"])

    def never(scope: Any) -> list[dict[str, str]]:
        raise AssertionError("descriptors asked for a non-HTTP scope")

    middleware = RateLimitMiddleware(
        app, client=AsyncClient("127.0.0.1:1"), domain="d", descriptors=never
    )
    asyncio.run(middleware({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]
