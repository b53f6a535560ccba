"""The client's public API, pinned: a change here is a change for every user."""

from __future__ import annotations

import importlib
import inspect

import pytest

import sluice_client
from sluice_client import (
    AsyncClient,
    AsyncQuota,
    Client,
    InvalidRequest,
    Quota,
    RateLimited,
    SluiceError,
    SluiceUnavailable,
)

PUBLIC = {
    "sluice_client": [
        "AsyncClient",
        "AsyncLease",
        "AsyncQuota",
        "Client",
        "Decision",
        "Descriptor",
        "DescriptorDecision",
        "DescriptorLike",
        "InvalidRequest",
        "Lease",
        "Limit",
        "OnUnavailable",
        "Quota",
        "QuotaDecision",
        "RateLimited",
        "SluiceError",
        "SluiceUnavailable",
        "rate_limit_headers",
    ],
    "sluice_client.lease": ["AsyncLease", "Lease"],
    "sluice_client.client": ["Client"],
    "sluice_client.aio": ["AsyncClient"],
    "sluice_client.errors": ["InvalidRequest", "RateLimited", "SluiceError", "SluiceUnavailable"],
    "sluice_client.types": [
        "UNIT_SECONDS",
        "Decision",
        "Descriptor",
        "DescriptorDecision",
        "DescriptorLike",
        "Limit",
        "OnUnavailable",
        "QuotaDecision",
    ],
    "sluice_client.quota": ["AsyncQuota", "Quota"],
    "sluice_client.headers": ["rate_limit_headers", "retry_after"],
    "sluice_client.sources": ["Source", "constant", "each", "nested"],
    "sluice_client.asgi": [
        "RateLimitMiddleware",
        "constant",
        "each",
        "header",
        "method",
        "nested",
        "path",
        "remote_address",
        "user",
    ],
    "sluice_client.grpc_interceptor": [
        "RateLimitInterceptor",
        "constant",
        "each",
        "full_method",
        "metadata",
        "nested",
    ],
}


@pytest.mark.parametrize("module_name", sorted(PUBLIC))
def test_all_is_pinned_and_importable(module_name: str) -> None:
    module = importlib.import_module(module_name)
    assert sorted(module.__all__) == sorted(PUBLIC[module_name])
    for name in module.__all__:
        assert hasattr(module, name), f"{module_name}.{name}"


def test_exception_tree() -> None:
    for exc in (SluiceUnavailable, InvalidRequest, RateLimited):
        assert issubclass(exc, SluiceError)
    assert issubclass(InvalidRequest, ValueError)


@pytest.mark.parametrize("cls", [Client, AsyncClient])
def test_everything_but_the_obvious_is_keyword_only(cls: type) -> None:
    def positional(function: object) -> list[str]:
        return [
            p.name
            for p in inspect.signature(function).parameters.values()  # type: ignore[arg-type]
            if p.kind is p.POSITIONAL_OR_KEYWORD
        ]

    assert positional(cls.__init__) == ["self", "target"]
    assert positional(cls.check) == ["self", "domain", "descriptors"]
    assert positional(cls.acquire) == ["self", "domain", "descriptors"]
    assert positional(cls.lease) == ["self", "domain", "entries"]
    # The two clients take the same arguments.
    for name in ("__init__", "check", "acquire", "lease"):
        sync_params = inspect.signature(getattr(Client, name)).parameters
        async_params = inspect.signature(getattr(AsyncClient, name)).parameters
        assert list(sync_params) == list(async_params)
    assert inspect.iscoroutinefunction(AsyncClient.check)
    assert positional(cls.quota) == ["self", "domain"]


def test_quota_allow_is_the_same_call_and_never_awaited() -> None:
    for cls in (Quota, AsyncQuota):
        params = inspect.signature(cls.allow).parameters
        assert list(params) == ["self", "bucket", "cost"]
        assert params["cost"].kind is inspect.Parameter.KEYWORD_ONLY
    # Deciding makes no network call, so there is nothing to await.
    assert not inspect.iscoroutinefunction(AsyncQuota.allow)
    assert inspect.iscoroutinefunction(AsyncQuota.close)
    for name in ("quota",):
        sync_params = inspect.signature(getattr(Client, name)).parameters
        async_params = inspect.signature(getattr(AsyncClient, name)).parameters
        assert list(sync_params) == list(async_params)


def test_version() -> None:
    assert sluice_client.__version__ == "0.1.0"
