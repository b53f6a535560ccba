"""The Envoy config ``sluice serve --transport pyvoy`` writes for the TLS settings: TLS 1.2+
with ALPN h2 on the gRPC listener, client certificates required with a client CA, the files
referenced by their own (absolute) paths, never copied or inlined. tests/integration/test_tls.py
checks what clients see."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sluice.pyvoy_launcher import envoy_config, sds_resources
from sluice.settings import Settings
from sluice.tls import ServerTls
from tests.support.certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _tls(pki: Pki, *, mutual: bool) -> ServerTls:
    tls = ServerTls.from_settings(
        Settings(
            transport="pyvoy",
            tls_cert_file=str(pki.server_cert),
            tls_key_file=str(pki.server_key),
            tls_client_ca_file=str(pki.ca) if mutual else "",
        )
    )
    assert tls is not None
    return tls


def _chains(config: dict) -> list[dict]:
    return [c for lst in config["static_resources"]["listeners"] for c in lst["filter_chains"]]


def test_plaintext_without_tls_settings(tmp_path: Path) -> None:
    config = envoy_config(Settings(transport="pyvoy"), tmp_path / "admin.sock")
    assert [lst["name"] for lst in config["static_resources"]["listeners"]] == ["listener"]
    assert all("transport_socket" not in chain for chain in _chains(config))


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_the_listener_serves_tls_with_the_files_by_path(
    tmp_path: Path, pki: Pki, mutual: bool
) -> None:
    config = envoy_config(
        Settings(transport="pyvoy"), tmp_path / "admin.sock", tls=_tls(pki, mutual=mutual)
    )
    # One TCP listener (no HTTP/3 one, which pyvoy's own TLS settings would add).
    assert [lst["name"] for lst in config["static_resources"]["listeners"]] == ["listener"]
    [chain] = _chains(config)
    socket = chain["transport_socket"]
    assert socket["name"] == "envoy.transport_sockets.tls"
    context = socket["typed_config"]
    assert context["@type"].endswith("tls.v3.DownstreamTlsContext")
    common = context["common_tls_context"]
    assert common["tls_params"] == {"tls_minimum_protocol_version": "TLSv1_2"}
    assert common["alpn_protocols"] == ["h2"]
    assert common["tls_certificates"] == [
        {
            "certificate_chain": {"filename": str(pki.server_cert.resolve())},
            "private_key": {"filename": str(pki.server_key.resolve())},
        }
    ]
    if mutual:
        assert common["validation_context"] == {"trusted_ca": {"filename": str(pki.ca.resolve())}}
        assert context["require_client_certificate"] is True
    else:
        assert "validation_context" not in common
        assert "require_client_certificate" not in context
    # The key itself is nowhere in the config Envoy is given (a file in the private dir).
    assert "PRIVATE KEY" not in json.dumps(config)


def test_relative_paths_become_absolute(
    tmp_path: Path, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(pki.ca.parent)
    tls = ServerTls.from_settings(
        Settings(transport="pyvoy", tls_cert_file="server.pem", tls_key_file="server.key")
    )
    assert tls is not None
    config = envoy_config(Settings(transport="pyvoy"), tmp_path / "admin.sock", tls=tls)
    [chain] = _chains(config)
    [certificate] = chain["transport_socket"]["typed_config"]["common_tls_context"][
        "tls_certificates"
    ]
    assert certificate["private_key"] == {"filename": str(pki.server_key.resolve())}


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
def test_followed_files_come_through_file_based_sds(tmp_path: Path, pki: Pki, mutual: bool) -> None:
    # What makes Envoy take up rotated files itself (tests/integration/test_tls_reload.py
    # shows it does): the listener names SDS secrets, each SDS file names files by path.
    tls = _tls(pki, mutual=mutual)
    config = envoy_config(
        Settings(transport="pyvoy"), tmp_path / "admin.sock", tls=tls, sds_dir=tmp_path
    )
    assert config["node"] == {"id": "sluice", "cluster": "sluice"}  # SDS needs one
    [chain] = _chains(config)
    context = chain["transport_socket"]["typed_config"]
    common = context["common_tls_context"]
    assert "tls_certificates" not in common and "validation_context" not in common

    def source(name: str) -> dict:
        path = str(tmp_path / f"{name}.json")
        return {"path_config_source": {"path": path}, "resource_api_version": "V3"}

    assert common["tls_certificate_sds_secret_configs"] == [
        {"name": "sluice_certificate", "sds_config": source("sluice_certificate")}
    ]
    files = sds_resources(tls)
    # One secret a file: Envoy refuses a file-based SDS file holding several.
    assert all(len(content["resources"]) == 1 for content in files.values())
    [certificate] = files["sluice_certificate.json"]["resources"]
    assert certificate["name"] == "sluice_certificate"
    assert certificate["tls_certificate"] == {
        "certificate_chain": {"filename": str(pki.server_cert.resolve())},
        "private_key": {"filename": str(pki.server_key.resolve())},
    }
    if mutual:
        assert common["validation_context_sds_secret_config"] == {
            "name": "sluice_client_ca",
            "sds_config": source("sluice_client_ca"),
        }
        assert context["require_client_certificate"] is True
        [ca] = files["sluice_client_ca.json"]["resources"]
        assert ca["validation_context"] == {"trusted_ca": {"filename": str(pki.ca.resolve())}}
    else:
        assert list(files) == ["sluice_certificate.json"]
        assert "require_client_certificate" not in context
    assert "PRIVATE KEY" not in json.dumps(config) + json.dumps(files)
