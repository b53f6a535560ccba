"""Settings: precedence, conversion, and the documented table staying true."""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import fields
from pathlib import Path

import pytest

from sluice.settings import Settings, add_arguments, env_name, flag_name, from_arguments

DOCS = Path(__file__).parents[2] / "docs" / "configuration.md"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


def test_flag_beats_environment_beats_default() -> None:
    settings = from_arguments(
        parse("--grpc-port", "1"), {"SLUICE_GRPC_PORT": "2", "SLUICE_HTTP_PORT": "3"}
    )
    assert (settings.grpc_port, settings.http_port, settings.host) == (1, 3, "0.0.0.0")


@pytest.mark.parametrize(("text", "value"), [("true", True), ("0", False), ("ON", True)])
def test_booleans_from_the_environment(text: str, value: bool) -> None:
    assert from_arguments(parse(), {"SLUICE_GLOBAL_SHADOW_MODE": text}).global_shadow_mode is value


def test_boolean_flags_have_a_negative_form() -> None:
    environ = {"SLUICE_RESPONSE_HEADERS": "true"}
    assert from_arguments(parse("--no-response-headers"), environ).response_headers is False


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (
            (),
            {"SLUICE_GLOBAL_SHADOW_MODE": "maybe"},
            "SLUICE_GLOBAL_SHADOW_MODE: 'maybe' is not a valid bool",
        ),
        (("--max-entries", "many"), {}, "--max-entries: 'many' is not a valid int"),
        (("--backend", "etcd"), {}, "--backend: unknown backend 'etcd' (memory, redis)"),
        (
            (),
            {"SLUICE_REDIS_FAILURE_MODE": "maybe"},
            "--redis-failure-mode: 'maybe' is not one of allow, deny, error",
        ),
        (
            ("--redis-client", "hiredis"),
            {},
            "--redis-client: 'hiredis' is not one of lean, redis-py",
        ),
        (("--redis-key-prefix", "a{b}:"), {}, "--redis-key-prefix: may not contain '{' or '}'"),
        (("--redis-pool-size", "0"), {}, "--redis-pool-size: must be at least 1"),
        (("--http-idle-timeout-s", "0"), {}, "--http-idle-timeout-s: must be above 0"),
        (
            (),
            {"SLUICE_HTTP_MAX_IDLE_CONNECTIONS": "0"},
            "--http-max-idle-connections: must be at least 1",
        ),
        (("--workers", "0"), {}, "--workers: '0' is not auto or a number >= 1"),
        ((), {"SLUICE_WORKERS": "many"}, "--workers: 'many' is not auto or a number >= 1"),
    ],
)
def test_bad_values_name_their_source(argv: tuple[str, ...], environ: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        from_arguments(parse(*argv), environ)
    assert str(info.value) == message


def test_redacted_hides_the_database_password() -> None:
    settings = Settings(database_url="postgresql://u:secret@h:5432/d")
    assert settings.redacted()["database_url"] == "postgresql://u:***@h:5432/d"


def test_redacted_hides_the_redis_password() -> None:
    settings = Settings(redis_url="redis+sentinel://u:secret@h1:26379,h2:26379/main/0")
    assert settings.redacted()["redis_url"] == "redis+sentinel://u:***@h1:26379,h2:26379/main/0"


def test_secrets_can_come_from_files(tmp_path: Path) -> None:
    token, url = tmp_path / "token", tmp_path / "url"
    token.write_text("s3cret\n")  # the newline an editor or `echo` leaves is not the secret
    url.write_text("postgresql://u:pw@h/db")
    settings = from_arguments(
        parse("--api-token-file", str(token)), {"SLUICE_DATABASE_URL_FILE": str(url)}
    )
    assert (settings.api_token, settings.database_url) == ("s3cret", "postgresql://u:pw@h/db")


def test_a_secret_given_directly_beats_its_file_at_the_same_level(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("from-file")
    assert (
        from_arguments(parse("--api-token", "direct", "--api-token-file", str(token)), {}).api_token
        == "direct"
    )
    environ = {"SLUICE_API_TOKEN_FILE": str(token)}
    assert from_arguments(parse(), environ).api_token == "from-file"
    assert from_arguments(parse("--api-token", "flag"), environ).api_token == "flag"


def test_only_secrets_have_file_forms(tmp_path: Path) -> None:
    secrets = {f.name for f in fields(Settings) if f.metadata["secret"]}
    assert secrets == {
        "database_url",
        "redis_url",
        "api_token",
        "admin_users",
        "admin_session_secret",
        "admin_oidc_client_secret",
    }
    port = tmp_path / "port"
    port.write_text("9")
    assert from_arguments(parse(), {"SLUICE_GRPC_PORT_FILE": str(port)}).grpc_port == 8081
    with pytest.raises(SystemExit):
        parse("--grpc-port-file", str(port))


def test_an_unreadable_secret_file_names_its_source(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(ValueError) as info:
        from_arguments(parse(), {"SLUICE_REDIS_URL_FILE": str(missing)})
    assert str(info.value) == (
        f"SLUICE_REDIS_URL_FILE: cannot read {missing}: No such file or directory"
    )


def test_workers_auto_is_the_cpus_this_process_may_run_on() -> None:
    assert from_arguments(parse("--workers", "auto"), {}).worker_count == len(
        os.sched_getaffinity(0)
    )
    assert from_arguments(parse(), {"SLUICE_WORKERS": "3"}).worker_count == 3
    assert from_arguments(parse(), {}).worker_count == 1


def test_local_cache_flag_has_a_negative_form() -> None:
    assert from_arguments(parse("--no-local-cache"), {}).local_cache is False
    assert from_arguments(parse(), {}).local_cache is True


def test_docs_table_lists_every_setting_with_its_default() -> None:
    rows = re.findall(
        r"^\| `(--[a-z-]+)` \| `(SLUICE_[A-Z_]+)` \| `([^`]*)` \|", DOCS.read_text(), re.M
    )
    expected = [
        (
            flag_name(f.name),
            env_name(f.name),
            str(f.default).lower() if isinstance(f.default, bool) else str(f.default) or '""',
        )
        for f in fields(Settings)
    ]
    assert rows == expected


def test_transport_is_pyvoy_or_grpcio_and_both_take_the_tls_settings() -> None:
    assert from_arguments(parse()).transport == "pyvoy"
    assert from_arguments(parse("--transport", "grpcio")).transport == "grpcio"
    with pytest.raises(ValueError, match="unknown transport 'h3'"):
        from_arguments(parse("--transport", "h3"))
    tls = ("--tls-cert-file", "c.pem", "--tls-key-file", "k.pem", "--tls-client-ca-file", "ca.pem")
    assert from_arguments(parse("--transport", "grpcio", *tls)).tls_cert_file == "c.pem"
    pyvoy = from_arguments(parse(*tls))
    assert (pyvoy.tls_cert_file, pyvoy.tls_key_file, pyvoy.tls_client_ca_file) == (
        "c.pem",
        "k.pem",
        "ca.pem",
    )
