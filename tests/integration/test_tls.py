"""Both ports over TLS, and mTLS that refuses clients without a certificate the CA signed.

Certificates are made by the test (tests/support/certs.py); the servers are real
``sluice serve`` processes, on both transports of the gRPC port (grpc.aio, and Envoy through
pyvoy); the gRPC client is sluice-client, the HTTP client urllib.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from sluice._proto.envoy.service.rate_limit_quota.v3 import rlqs_pb2, rlqs_pb2_grpc
from sluice._proto.envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc
from sluice_client import Client, SluiceUnavailable
from tests.support.certs import Pki, make_pki
from tests.support.processes import SluiceProcess, run_sluice, sluice_serve

POLICY = """\
domain: tls
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2}
"""
TRANSPORTS = ["grpcio", "pyvoy"]


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _serve(workdir: Path, pki: Pki, *, mutual: bool, transport: str) -> Iterator[SluiceProcess]:
    policy = workdir / "policy.yaml"
    policy.write_text(POLICY)
    args = ["--transport", transport]
    args += ["--tls-cert-file", str(pki.server_cert), "--tls-key-file", str(pki.server_key)]
    if mutual:
        args += ["--tls-client-ca-file", str(pki.ca)]
    with sluice_serve(
        workdir, config=policy, extra_args=args, https=pki.client_context(with_cert=mutual)
    ) as server:
        yield server


@pytest.fixture(scope="module", params=TRANSPORTS)
def tls_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("tls")
    yield from _serve(workdir, pki, mutual=False, transport=request.param)


@pytest.fixture(scope="module", params=TRANSPORTS)
def mtls_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki
) -> Iterator[SluiceProcess]:
    workdir = tmp_path_factory.mktemp("mtls")
    yield from _serve(workdir, pki, mutual=True, transport=request.param)


def _check(server: SluiceProcess, user: str, **tls: object) -> bool:
    with Client(server.grpc_target, on_unavailable="raise", timeout_s=5, **tls) as client:
        return client.check("tls", [{"user": user}]).allowed


def _quota_stream(server: SluiceProcess, pki: Pki) -> int:
    """Bucket actions in the answer to one RLQS report over mTLS."""
    credentials = grpc.ssl_channel_credentials(
        pki.ca.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes()
    )
    report = rlqs_pb2.RateLimitQuotaUsageReports(domain="tls")
    report.bucket_quota_usages.add().bucket_id.bucket["user"] = "rlqs"
    with grpc.secure_channel(server.grpc_target, credentials) as channel:
        stub = rlqs_pb2_grpc.RateLimitQuotaServiceStub(channel)
        [response] = stub.StreamRateLimitQuotas(iter([report]), timeout=10)
    return len(response.bucket_action)


def _plaintext_call(server: SluiceProcess) -> grpc.StatusCode:
    request = rls_pb2.RateLimitRequest(domain="tls")
    request.descriptors.add().entries.add(key="user", value="plain")
    with grpc.insecure_channel(server.grpc_target) as channel:
        try:
            rls_pb2_grpc.RateLimitServiceStub(channel).ShouldRateLimit(request, timeout=5)
        except grpc.RpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def _get(url: str, context: ssl.SSLContext | None) -> int:
    with urllib.request.urlopen(url, timeout=5, context=context) as response:
        return response.status


def _post_json(server: SluiceProcess, context: ssl.SSLContext) -> dict:
    body = json.dumps({"domain": "tls", "descriptors": [{"entries": [{"key": "user"}]}]})
    request = urllib.request.Request(server.http_url + "/json", data=body.encode())
    with urllib.request.urlopen(request, timeout=5, context=context) as response:
        return json.loads(response.read())


# --- TLS -------------------------------------------------------------------------------


def test_grpc_over_tls_decides_for_a_client_that_trusts_the_ca(
    tls_server: SluiceProcess, pki: Pki
) -> None:
    decisions = [_check(tls_server, "ada", root_certificates=pki.ca) for _ in range(3)]
    assert decisions == [True, True, False]


def test_a_plaintext_grpc_client_gets_no_answer_from_a_tls_port(tls_server: SluiceProcess) -> None:
    assert _plaintext_call(tls_server) == grpc.StatusCode.UNAVAILABLE


def test_a_client_that_does_not_trust_the_ca_refuses_the_server(
    tls_server: SluiceProcess, pki: Pki
) -> None:
    # The system's CA bundle does not hold the test CA: the client must refuse to talk.
    with pytest.raises(SluiceUnavailable):
        _check(tls_server, "bob", tls=True)


def test_http_over_tls(tls_server: SluiceProcess, pki: Pki) -> None:
    assert tls_server.http_url.startswith("https://")
    assert _get(tls_server.http_url + "/healthcheck", pki.client_context()) == 200
    assert _post_json(tls_server, pki.client_context())["overallCode"] == "OK"
    plaintext = tls_server.http_url.replace("https://", "http://")
    with pytest.raises((urllib.error.URLError, ConnectionError)):
        _get(plaintext + "/healthcheck", None)


# --- mTLS ------------------------------------------------------------------------------


def test_mtls_admits_a_client_with_a_certificate_the_ca_signed(
    mtls_server: SluiceProcess, pki: Pki
) -> None:
    tls = {
        "root_certificates": pki.ca,
        "certificate_chain": pki.client_cert,
        "private_key": pki.client_key,
    }
    assert [_check(mtls_server, "ada", **tls) for _ in range(3)] == [True, True, False]
    assert _quota_stream(mtls_server, pki) == 1  # RLQS on the same port, same certificates
    assert _get(mtls_server.http_url + "/healthcheck", pki.client_context()) == 200
    assert _get(mtls_server.http_url + "/metrics", pki.client_context()) == 200


@pytest.mark.parametrize("client", ["no certificate", "certificate from another CA"])
def test_mtls_refuses_a_grpc_client_without_a_valid_certificate(
    mtls_server: SluiceProcess, pki: Pki, client: str
) -> None:
    tls: dict[str, object] = {"root_certificates": pki.ca}
    if client != "no certificate":
        tls.update(certificate_chain=pki.rogue_cert, private_key=pki.rogue_key)
    with pytest.raises(SluiceUnavailable):
        _check(mtls_server, "mallory", **tls)
    assert _plaintext_call(mtls_server) == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("client", ["no certificate", "certificate from another CA"])
def test_mtls_refuses_an_http_client_without_a_valid_certificate(
    mtls_server: SluiceProcess, pki: Pki, client: str
) -> None:
    context = pki.client_context(with_cert=False, rogue=client != "no certificate")
    for path in ("/healthcheck", "/metrics", "/rlconfig"):
        with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
            _get(mtls_server.http_url + path, context)
    # The refused handshakes left the server serving.
    assert _get(mtls_server.http_url + "/healthcheck", pki.client_context()) == 200


# --- bad TLS settings ------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_bad_tls_settings_stop_the_start_naming_the_flag(
    tmp_path: Path, pki: Pki, transport: str
) -> None:
    not_pem, missing = tmp_path / "not-pem", tmp_path / "missing.pem"
    not_pem.write_text("hello")
    cert, key = ["--tls-cert-file", str(pki.server_cert)], ["--tls-key-file", str(pki.server_key)]
    cases = [
        (cert, "--tls-cert-file and --tls-key-file: set both or neither"),
        (["--tls-client-ca-file", str(pki.ca)], "--tls-client-ca-file: client certificates need"),
        (["--tls-cert-file", str(missing), *key], f"--tls-cert-file: cannot read {missing}"),
        (
            [*cert, "--tls-key-file", str(pki.client_key)],
            "--tls-cert-file/--tls-key-file: not a certificate and its matching key",
        ),
        (
            [*cert, *key, "--tls-client-ca-file", str(not_pem)],
            f"--tls-client-ca-file: {not_pem} holds no PEM block",
        ),
    ]
    db = ["--database-url", f"sqlite:///{tmp_path / 'db.sqlite'}", "--transport", transport]
    for args, message in cases:
        result = run_sluice(["serve", "--grpc-port", "0", "--http-port", "0", *db, *args])
        assert result.returncode == 1, (message, result.stderr)
        assert message in result.stderr, (message, result.stderr)
        assert "Traceback" not in result.stderr
