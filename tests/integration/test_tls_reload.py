"""Certificates rotated under a running ``sluice serve``, on both transports of the gRPC port
(grpc.aio's certificate fetcher; Envoy's file-based SDS) and on the HTTP port: new handshakes
get the new certificate while connections opened before keep working, and a file that is not
a certificate keeps the one serving (and says why in the log).

The new certificate comes from another CA than the first: a client that trusts only the
first CA can go on using its connection after the rotation only if that connection is the one
it opened before (a new handshake would fail)."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest

from sluice_client import Client, SluiceUnavailable
from tests.support.certs import Pki, make_pki
from tests.support.processes import SluiceProcess, sluice_serve, wait_until

POLICY = """\
domain: rotation
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 1000}
"""
REJECTED = "are not used, the previous certificate serves on"

pytestmark = pytest.mark.slow


def _place(source: Path, target: Path) -> None:
    """Move a file into place, as a Secret volume or ``mv`` does (never written over)."""
    scratch = target.with_name(target.name + ".new")
    scratch.write_bytes(source.read_bytes())
    os.replace(scratch, target)


def _der(pem_file: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(pem_file.read_text())


def _served_certificate(port: int, *, h2: bool) -> bytes | None:
    """The certificate a new handshake gets (not verified: the test compares it)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if h2:
        context.set_alpn_protocols(["h2"])
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with context.wrap_socket(raw, server_hostname="localhost") as tls:
            return tls.getpeercert(binary_form=True)


@pytest.fixture(scope="module")
def first(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("first"))


@pytest.fixture(scope="module")
def second(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("second"))


@pytest.fixture(params=["grpcio", "pyvoy"])
def server(request: pytest.FixtureRequest, tmp_path: Path, first: Pki) -> Iterator[SluiceProcess]:
    certs = tmp_path / "certs"
    certs.mkdir()
    _place(first.server_cert, certs / "tls.crt")
    _place(first.server_key, certs / "tls.key")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    args = ["--transport", request.param, "--tls-watch-interval-s", "0.1"]
    args += ["--tls-cert-file", str(certs / "tls.crt"), "--tls-key-file", str(certs / "tls.key")]
    with sluice_serve(
        tmp_path, config=policy, extra_args=args, https=first.client_context(with_cert=False)
    ) as process:
        yield process


def test_rotation_reaches_new_handshakes_and_spares_open_connections(
    server: SluiceProcess, tmp_path: Path, first: Pki, second: Pki
) -> None:
    certs = tmp_path / "certs"
    held_grpc = Client(
        server.grpc_target, on_unavailable="raise", timeout_s=5, root_certificates=first.ca
    )
    held_http = http.client.HTTPSConnection(
        "127.0.0.1", server.http_port, context=first.client_context(with_cert=False), timeout=5
    )
    try:
        assert held_grpc.check("rotation", [{"user": "before"}]).allowed
        held_http.request("GET", "/healthcheck")
        assert held_http.getresponse().read() and held_http.sock is not None
        held_socket = held_http.sock
        assert _served_certificate(server.grpc_port, h2=True) == _der(first.server_cert)

        _place(second.server_key, certs / "tls.key")
        _place(second.server_cert, certs / "tls.crt")
        new = _der(second.server_cert)
        wait_until(
            lambda: (
                _served_certificate(server.grpc_port, h2=True) == new
                and _served_certificate(server.http_port, h2=False) == new
            ),
            20,
            "the new certificate on both ports",
        )
        # New clients trusting the new CA are served...
        with Client(
            server.grpc_target, on_unavailable="raise", timeout_s=5, root_certificates=second.ca
        ) as fresh:
            assert fresh.check("rotation", [{"user": "after"}]).allowed
        # ...and the connections opened before go on, though a new handshake would fail them.
        assert held_grpc.check("rotation", [{"user": "held"}]).allowed
        held_http.request("GET", "/healthcheck")
        assert held_http.getresponse().status == 200
        assert held_http.sock is held_socket

        # A certificate file that is no certificate: logged, and the last good one serves on.
        rejected_before = server.log().count(REJECTED)
        garbage = tmp_path / "garbage.pem"
        garbage.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
        _place(garbage, certs / "tls.crt")
        wait_until(lambda: server.log().count(REJECTED) > rejected_before, 20, "the rejection")
        assert _served_certificate(server.http_port, h2=False) == new
        assert _served_certificate(server.grpc_port, h2=True) == new
        assert held_grpc.check("rotation", [{"user": "still"}]).allowed
        # Counted for alerting (the rename of the key before the certificate may have shown
        # the watcher a mismatched pair once: a refusal too).
        metrics = _metrics(server, second)
        assert metrics["sluice_tls_reloads_total"] == 1
        assert metrics["sluice_tls_reload_failures_total"] in (1, 2)
    finally:
        held_grpc.close()
        held_http.close()


def _metrics(server: SluiceProcess, pki: Pki) -> dict[str, float]:
    context = ssl.create_default_context(cafile=pki.ca)
    connection = http.client.HTTPSConnection("127.0.0.1", server.http_port, context=context)
    try:
        connection.request("GET", "/metrics")
        text = connection.getresponse().read().decode()
    finally:
        connection.close()
    return {
        name: float(value)
        for name, value in (line.split(" ", 1) for line in text.splitlines())
        if name.startswith("sluice_tls_")
    }


def _admitted(server: SluiceProcess, pki: Pki, server_ca: Path) -> tuple[bool, bool]:
    """Whether a client with ``pki``'s client certificate is admitted on the gRPC port and on
    the HTTP port (a refused handshake is a False, whichever way it shows)."""
    try:
        with Client(
            server.grpc_target,
            on_unavailable="raise",
            timeout_s=5,
            root_certificates=server_ca,
            certificate_chain=pki.client_cert,
            private_key=pki.client_key,
        ) as client:
            grpc_ok = client.check("rotation", [{"user": "mtls"}]).allowed
    except SluiceUnavailable:
        grpc_ok = False
    context = ssl.create_default_context(cafile=server_ca)
    context.load_cert_chain(pki.client_cert, pki.client_key)
    connection = http.client.HTTPSConnection("127.0.0.1", server.http_port, context=context)
    try:
        connection.request("GET", "/healthcheck")
        http_ok = connection.getresponse().status == 200
    except (OSError, ssl.SSLError):
        http_ok = False
    finally:
        connection.close()
    return grpc_ok, http_ok


@pytest.mark.parametrize("transport", ["grpcio", "pyvoy"])
def test_a_rotated_client_ca_admits_the_clients_it_signed(
    tmp_path: Path, first: Pki, second: Pki, transport: str
) -> None:
    certs = tmp_path / "certs"
    certs.mkdir()
    _place(first.ca, certs / "ca.crt")
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    args = ["--transport", transport, "--tls-watch-interval-s", "0.1"]
    args += ["--tls-cert-file", str(first.server_cert), "--tls-key-file", str(first.server_key)]
    args += ["--tls-client-ca-file", str(certs / "ca.crt")]
    with sluice_serve(
        tmp_path, config=policy, extra_args=args, https=first.client_context()
    ) as server:
        assert _admitted(server, second, first.ca) == (False, False)
        _place(second.ca, certs / "ca.crt")
        wait_until(
            lambda: _admitted(server, second, first.ca) == (True, True),
            20,
            "clients of the new CA admitted on both ports",
        )
