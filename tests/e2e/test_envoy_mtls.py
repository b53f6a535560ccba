"""End to end over mTLS: a real Envoy asks a `sluice serve` that demands client certificates.

Envoy's TLS settings for the rate-limit cluster are the snippet in docs/security.md, read
from there (only the certificate paths are swapped for ones made by the test), so the
documented configuration is the tested one. An Envoy holding a certificate from another CA
is refused by Sluice at the handshake; Envoy fails open, so its requests pass and its
``ratelimit.error`` counter says why. Sluice runs on both transports of its gRPC port
(grpc.aio, and Envoy through pyvoy, whose listener then does the TLS).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.certs import Pki, make_pki
from tests.support.envoy import envoy_serve, http_get
from tests.support.envoy_example import (
    ENVOY_CONFIG,
    POLICY,
    STATS,
    UPSTREAM_BODY,
    example_config,
    upstream_server,
)
from tests.support.processes import SluiceProcess, free_port, sluice_serve

pytestmark = pytest.mark.e2e

SECURITY_DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"


def documented_transport_socket(pki: Pki, *, rogue: bool = False) -> dict[str, Any]:
    """The UpstreamTlsContext of docs/security.md, with the test's certificate files."""
    blocks = re.findall(r"```yaml\n(.*?)```", SECURITY_DOC.read_text(), re.S)
    [block] = [b for b in blocks if "UpstreamTlsContext" in b]
    text = "\n".join(line[2:] for line in block.splitlines())  # the list item's indent
    for documented, actual in {
        "/certs/envoy.pem": pki.rogue_cert if rogue else pki.client_cert,
        "/certs/envoy.key": pki.rogue_key if rogue else pki.client_key,
        "/certs/ca.pem": pki.ca,
    }.items():
        assert documented in text, documented
        text = text.replace(documented, str(actual))
    return yaml.safe_load(text)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module", params=["grpcio", "pyvoy"])
def mtls_sluice(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("envoy-mtls")
    args = ["--transport", request.param]
    args += ["--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key)]
    args += ["--tls-client-ca-file", str(pki.ca)]
    with sluice_serve(workdir, config=POLICY, extra_args=args, https=pki.client_context()) as s:
        yield s


@pytest.fixture(scope="module")
def upstream() -> Iterator[int]:
    with upstream_server() as port:
        yield port


def _run(
    workdir: Path, pki: Pki, sluice: SluiceProcess, upstream: int, *, rogue: bool
) -> tuple[list[int], dict[str, int]]:
    listener, admin = free_port(), free_port()
    config = example_config(
        ENVOY_CONFIG,
        listener=listener,
        admin=admin,
        upstream=upstream,
        sluice=sluice.grpc_port,
    )
    [cluster] = [c for c in config["static_resources"]["clusters"] if c["name"] == "sluice"]
    cluster.update(documented_transport_socket(pki, rogue=rogue))
    with envoy_serve(workdir, config, admin_port=admin, listener_ports=(listener,)) as envoy:
        # /limited/ allows 3 an hour in all; this module's Sluice serves no other test.
        responses = [http_get(listener, "/limited/") for _ in range(5)]
        counters = {
            name.removeprefix(STATS): value
            for name, value in envoy.counters("ratelimit").items()
            if name.startswith(STATS)
        }
    for response in responses:
        if response.status == 200:
            assert response.body == UPSTREAM_BODY
    return [r.status for r in responses], counters


def test_envoy_with_a_certificate_the_ca_signed_gets_decisions(
    tmp_path: Path, pki: Pki, mtls_sluice: SluiceProcess, upstream: int
) -> None:
    statuses, counters = _run(tmp_path, pki, mtls_sluice, upstream, rogue=False)
    assert statuses == [200, 200, 200, 429, 429]
    assert counters.get("error", 0) == 0 and counters.get("failure_mode_allowed", 0) == 0
    assert (counters.get("ok"), counters.get("over_limit")) == (3, 2)


def test_envoy_with_a_certificate_of_another_ca_is_refused(
    tmp_path: Path, pki: Pki, mtls_sluice: SluiceProcess, upstream: int
) -> None:
    statuses, counters = _run(tmp_path, pki, mtls_sluice, upstream, rogue=True)
    # Sluice never answered, so Envoy failed open (the example's failure_mode_deny: false).
    assert statuses == [200] * 5
    assert counters.get("error", 0) == 5, counters
    assert counters.get("ok", 0) == 0 and counters.get("over_limit", 0) == 0
