"""Python client for Sluice, the rate-limit service speaking Envoy's RLS v3 API.

``Client`` (blocking) and ``AsyncClient`` (asyncio) ask ``check()`` once or ``acquire()``
(wait until admitted, up to a bound), or take a concurrency ``lease()`` (renewed while
held). ``quota(domain)`` returns a ``Quota`` (``AsyncQuota``) that decides in process from
assignments Sluice streams (RLQS). Integrations: ``sluice_client.asgi`` (middleware) and
``sluice_client.grpc_interceptor`` (grpc.aio servers). Exceptions: see
``sluice_client.errors``.
"""

from __future__ import annotations

from sluice_client.aio import AsyncClient
from sluice_client.client import Client
from sluice_client.errors import InvalidRequest, RateLimited, SluiceError, SluiceUnavailable
from sluice_client.headers import rate_limit_headers
from sluice_client.lease import AsyncLease, Lease
from sluice_client.quota import AsyncQuota, Quota
from sluice_client.types import (
    Decision,
    Descriptor,
    DescriptorDecision,
    DescriptorLike,
    Limit,
    OnUnavailable,
    QuotaDecision,
)

__all__ = [
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
]

__version__ = "0.1.0"
