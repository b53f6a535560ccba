"""How a client reaches Sluice: transport security and channel options, resolved once for
both Client and AsyncClient."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import grpc

__all__ = ["ChannelConfig", "PemSource", "channel_config"]

# PEM bytes, or the path of a PEM file.
PemSource: TypeAlias = bytes | str | os.PathLike[str]

_DEFAULT_OPTIONS: tuple[tuple[str, Any], ...] = (
    # gRPC backs off reconnecting up to 120 s by default; a rate limiter that came back after
    # an outage would then go unused (every call degraded) for up to two minutes.
    ("grpc.max_reconnect_backoff_ms", 5000),
    # Round robin over every address the target resolves to (a Kubernetes headless Service,
    # ``ipv4:HOST:PORT,HOST:PORT``): calls spread over the servers, and the one retry of a
    # call refused with UNAVAILABLE (client.py) goes to the next one, on another connection.
    # gRPC's own retry policy would do that retry, but grpcio 1.85 sometimes never sends it
    # (its timer, drawn at 0 ms, does not fire): the call then waits out its deadline.
    ("grpc.service_config", json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})),
)


@dataclass(frozen=True, slots=True)
class ChannelConfig:
    target: str
    credentials: grpc.ChannelCredentials | None  # None: plaintext
    options: tuple[tuple[str, Any], ...]


def channel_config(
    target: str,
    *,
    credentials: grpc.ChannelCredentials | None,
    tls: bool,
    root_certificates: PemSource | None,
    certificate_chain: PemSource | None,
    private_key: PemSource | None,
    options: Sequence[tuple[str, Any]],
) -> ChannelConfig:
    if not isinstance(target, str) or not target:
        raise ValueError("target: must be a non-empty string such as 'localhost:8081'")
    pems = (root_certificates, certificate_chain, private_key)
    if credentials is not None and any(p is not None for p in pems):
        raise ValueError("pass either credentials or PEM files (root/client certificates)")
    if (certificate_chain is None) != (private_key is None):
        raise ValueError("mTLS needs both certificate_chain and private_key")
    if credentials is None and (tls or any(p is not None for p in pems)):
        credentials = grpc.ssl_channel_credentials(
            root_certificates=_pem(root_certificates),
            private_key=_pem(private_key),
            certificate_chain=_pem(certificate_chain),
        )
    given = {name for name, _ in options}
    merged = tuple(o for o in _DEFAULT_OPTIONS if o[0] not in given) + tuple(options)
    return ChannelConfig(target, credentials, merged)


def _pem(source: PemSource | None) -> bytes | None:
    if source is None or isinstance(source, bytes):
        return source
    return Path(source).read_bytes()
