"""envoyproxy/ratelimit's variables (sluice/upstream_env.py): each one honoured as upstream
reads it, or named in the warning line; Sluice's own names win; docs/migrating.md lists them
all."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from sluice.settings import add_arguments, flag_name, from_arguments, resolve
from sluice.upstream_env import HONOURED, NOT_HONOURED, go_duration_ms, warning_line

MIGRATING = Path(__file__).parents[2] / "docs" / "migrating.md"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(argv)


TLS = {
    "GRPC_SERVER_USE_TLS": "true",
    "GRPC_SERVER_TLS_CERT": "/tls/cert.pem",
    "GRPC_SERVER_TLS_KEY": "/tls/key.pem",
    "GRPC_CLIENT_TLS_CACERT": "/tls/ca.pem",
}
REDIS_CLIENT_CERT = {"REDIS_TLS_CLIENT_CERT": "/c.pem", "REDIS_TLS_CLIENT_KEY": "/k.pem"}
RUNTIME = {"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit"}


@pytest.mark.parametrize(
    ("environ", "setting", "value"),
    [
        # upstream reads RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY/*.yaml
        (RUNTIME, "config", "/data/ratelimit/config"),
        ({"RUNTIME_SUBDIRECTORY": "rl"}, "config", "/srv/runtime_data/current/rl/config"),
        ({"RUNTIME_ROOT": "/data", "RUNTIME_APPDIRECTORY": "limits"}, "config", "/data/limits"),
        ({"GRPC_HOST": "10.0.0.1"}, "host", "10.0.0.1"),
        ({"HOST": "10.0.0.2", "GRPC_HOST": "10.0.0.1"}, "host", "10.0.0.1"),
        ({"GRPC_PORT": "9081"}, "grpc_port", 9081),
        ({"PORT": "9080"}, "http_port", 9080),
        (TLS, "tls_cert_file", "/tls/cert.pem"),
        (TLS, "tls_key_file", "/tls/key.pem"),
        (TLS, "tls_client_ca_file", "/tls/ca.pem"),
        ({**TLS, "GRPC_SERVER_USE_TLS": "false"}, "tls_cert_file", ""),  # upstream: no TLS
        ({"BACKEND_TYPE": "redis", "REDIS_URL": "r:6379"}, "backend", "redis"),
        ({"REDIS_URL": "r:6379"}, "backend", "redis"),  # upstream's default backend
        ({"REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": "r:6379"}, "redis_url", "redis://r:6379"),
        ({"REDIS_URL": "r:6379", "REDIS_TLS": "true"}, "redis_url", "rediss://r:6379"),
        ({"REDIS_URL": "r:6379", "REDIS_AUTH": "pw"}, "redis_url", "redis://:pw@r:6379"),
        (
            {"REDIS_URL": "r:6379", "REDIS_AUTH": "me:p@ss:w/rd"},
            "redis_url",
            "redis://me:p%40ss%3Aw%2Frd@r:6379",
        ),
        (
            {"REDIS_TYPE": "sentinel", "REDIS_URL": "mymaster,s1:26379,s2:26379"},
            "redis_url",
            "redis+sentinel://s1:26379,s2:26379/mymaster",
        ),
        (
            {"REDIS_TYPE": "SENTINEL", "REDIS_URL": "m,s1:26379", "REDIS_TLS": "1"},
            "redis_url",
            "rediss+sentinel://s1:26379/m",
        ),
        (
            {"REDIS_TYPE": "cluster", "REDIS_URL": "n1:7000, n2:7001", "REDIS_AUTH": "pw"},
            "redis_url",
            "redis+cluster://:pw@n1:7000,n2:7001",
        ),
        ({"REDIS_URL": "redis://r:6379/2"}, "redis_url", "redis://r:6379/2"),  # Sluice's form
        ({"REDIS_TLS_CACERT": "/ca.pem"}, "redis_tls_ca_file", "/ca.pem"),
        (REDIS_CLIENT_CERT, "redis_tls_cert_file", "/c.pem"),
        (REDIS_CLIENT_CERT, "redis_tls_key_file", "/k.pem"),
        ({"CACHE_KEY_PREFIX": "rl_"}, "redis_key_prefix", "rl_"),
        ({"REDIS_TIMEOUT": "10s"}, "redis_timeout_ms", 10000),  # upstream's default
        ({"REDIS_TIMEOUT": "250ms"}, "redis_timeout_ms", 250),
        ({"REDIS_TIMEOUT": "1m30s"}, "redis_timeout_ms", 90000),
        ({"REDIS_TIMEOUT": "500us"}, "redis_timeout_ms", 1),  # Sluice's resolution: 1 ms
        ({"REDIS_POOL_SIZE": "10"}, "redis_pool_size", 10),
        ({"LOCAL_CACHE_SIZE_IN_BYTES": "0"}, "local_cache", False),  # upstream: 0 disables
        ({"LOCAL_CACHE_SIZE_IN_BYTES": "1048576"}, "local_cache", True),
        ({"SHADOW_MODE": "true"}, "global_shadow_mode", True),
        ({"SHADOW_MODE": "T"}, "global_shadow_mode", True),
        ({"SHADOW_MODE": "0"}, "global_shadow_mode", False),
        ({"LIMIT_RESPONSE_HEADERS_ENABLED": "true"}, "response_headers", True),
        ({"NEAR_LIMIT_RATIO": "0.9"}, "near_limit_ratio", 0.9),
        ({"LOG_LEVEL": "warn"}, "log_level", "WARNING"),  # logrus's names
        ({"LOG_LEVEL": "DEBUG"}, "log_level", "DEBUG"),
        ({"LOG_LEVEL": "trace"}, "log_level", "DEBUG"),
        ({"LOG_LEVEL": "panic"}, "log_level", "CRITICAL"),
        ({"LOG_FORMAT": "json"}, "log_format", "json"),
        # upstream's USE_STATSD defaults to true, to localhost:8125
        ({"USE_STATSD": "true"}, "statsd_address", "localhost:8125"),
        ({"STATSD_HOST": "statsd", "STATSD_PORT": "9125"}, "statsd_address", "statsd:9125"),
        ({"USE_STATSD": "false", "STATSD_HOST": "statsd"}, "statsd_address", ""),
        ({"USE_DOG_STATSD": "true"}, "statsd_address", "localhost:8125"),
        ({"USE_DOG_STATSD": "true"}, "statsd_flavor", "dogstatsd"),
        # lyft/gostats, upstream's statsd client, sends over TCP by default
        ({"STATSD_HOST": "statsd"}, "statsd_protocol", "tcp"),
        ({"STATSD_HOST": "statsd", "STATSD_PROTOCOL": "udp"}, "statsd_protocol", "udp"),
        ({"EXTRA_TAGS": "env:prod,team:edge"}, "statsd_tags", "env:prod,team:edge"),
        ({"STATS_FLUSH_INTERVAL": "500ms"}, "statsd_flush_interval_s", 0.5),
        ({"USE_STATSD": "true", "DISABLE_STATS": "true"}, "statsd_address", ""),
        ({"MERGE_DOMAIN_CONFIG": "true"}, "merge_domain_config", True),
        ({"MERGE_DOMAIN_CONFIG": "0"}, "merge_domain_config", False),


        # upstream's default, 24h
        ({"GRPC_MAX_CONNECTION_AGE": "24h"}, "grpc_max_connection_age_s", 86400.0),
        ({"GRPC_MAX_CONNECTION_AGE": "90s"}, "grpc_max_connection_age_s", 90.0),
        ({"GRPC_MAX_CONNECTION_AGE_GRACE": "1h"}, "grpc_max_connection_age_grace_s", 3600.0),
        ({"GRPC_MAX_CONNECTION_AGE_GRACE": "1500ms"}, "grpc_max_connection_age_grace_s", 1.5),
    ],
)  # fmt: skip
def test_upstream_variables_are_honoured(environ: dict, setting: str, value: Any) -> None:
    settings, sources = resolve(parse(), environ)
    assert getattr(settings, setting) == value
    names = [name for row in HONOURED if row.setting == setting for name in row.names]
    expected = (
        "default" if value == "" else "upstream " + ", ".join(n for n in names if n in environ)
    )
    assert sources[setting] == expected


@pytest.mark.parametrize("value", ["true", "false", "1", "F"])
def test_either_runtime_watch_root_mode_is_honoured_by_watching(value: str) -> None:
    environ = {"RUNTIME_WATCH_ROOT": value, "RUNTIME_ROOT": "/data"}
    settings, sources = resolve(parse(), environ)
    assert settings.config_watch_interval_s == 1.0
    assert sources["config_watch_interval_s"] == "default"
    assert warning_line(environ) is None


def test_a_bad_runtime_watch_root_names_the_variable() -> None:
    with pytest.raises(ValueError, match="RUNTIME_WATCH_ROOT"):
        resolve(parse(), {"RUNTIME_WATCH_ROOT": "maybe"})


def test_every_honoured_row_names_a_setting() -> None:
    settings = from_arguments(parse(), {})
    assert [row.setting for row in HONOURED if not hasattr(settings, row.setting)] == []


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"BACKEND_TYPE": "memcache"},
            "BACKEND_TYPE: memcache is not supported: Sluice keeps counters in Redis "
            "(BACKEND_TYPE=redis with REDIS_URL) or in memory",
        ),
        ({"BACKEND_TYPE": "etcd"}, "BACKEND_TYPE: unknown backend 'etcd' (redis)"),
        (
            {"REDIS_TYPE": "ring", "REDIS_URL": "r:1"},
            "REDIS_TYPE: 'ring' is not single, sentinel or cluster",
        ),
        (
            {"REDIS_SOCKET_TYPE": "unix", "REDIS_URL": "r:1"},
            "REDIS_SOCKET_TYPE: Redis over a unix socket is not supported; "
            "use REDIS_SOCKET_TYPE=tcp and REDIS_URL=HOST:PORT",
        ),
        (
            {"REDIS_SOCKET_TYPE": "udp", "REDIS_URL": "r:1"},
            "REDIS_SOCKET_TYPE: 'udp' is not tcp or unix",
        ),
        (
            {"REDIS_TYPE": "sentinel", "REDIS_URL": "r:1"},
            "REDIS_URL: REDIS_TYPE=sentinel takes MASTER_NAME,HOST:PORT[,HOST:PORT...]",
        ),
        ({"REDIS_URL": "a:1,b:2"}, "REDIS_URL: REDIS_TYPE=single takes one HOST:PORT"),
        (
            {"REDIS_AUTH": "pw", "REDIS_TLS": "true"},
            "REDIS_AUTH, REDIS_TLS: set REDIS_URL too (upstream's default, the unix socket "
            "/var/run/nutcracker/ratelimit.sock, is not supported)",
        ),
        ({"SHADOW_MODE": "yes"}, "SHADOW_MODE: 'yes' is not a valid bool"),  # Go's ParseBool
        (
            {"REDIS_TIMEOUT": "10"},
            "REDIS_TIMEOUT: '10' is not a duration (e.g. 100ms, 10s, 1m30s)",
        ),
        ({"REDIS_TIMEOUT": "0s"}, "REDIS_TIMEOUT: '0s' must be above 0"),
        ({"GRPC_PORT": "eighty"}, "GRPC_PORT: 'eighty' is not a valid int"),
        ({"NEAR_LIMIT_RATIO": "most"}, "NEAR_LIMIT_RATIO: 'most' is not a valid float"),
        ({"LOCAL_CACHE_SIZE_IN_BYTES": "1M"}, "LOCAL_CACHE_SIZE_IN_BYTES: '1M' is not a valid int"),
        ({"CACHE_KEY_PREFIX": "{rl}"}, "CACHE_KEY_PREFIX: may not contain '{' or '}'"),
        ({"REDIS_POOL_SIZE": "0"}, "REDIS_POOL_SIZE: must be at least 1"),
        (
            {"LOG_LEVEL": "verbose"},
            "LOG_LEVEL: 'verbose' is not one of debug, error, fatal, info, panic, trace, warn, "
            "warning",
        ),
        ({"LOG_FORMAT": "xml"}, "LOG_FORMAT: 'xml' is not text or json"),
        (
            {"USE_STATSD": "true", "USE_DOG_STATSD": "true"},
            "USE_STATSD, USE_DOG_STATSD: set one of them, not both (as upstream)",
        ),
        ({"STATSD_PORT": "udp"}, "STATSD_PORT: 'udp' is not a valid int"),
        ({"STATSD_PROTOCOL": "quic"}, "STATSD_PROTOCOL: 'quic' is not tcp or udp"),
        ({"EXTRA_TAGS": "env"}, "EXTRA_TAGS: 'env' is not KEY:VALUE"),
        (
            {"STATS_FLUSH_INTERVAL": "10"},
            "STATS_FLUSH_INTERVAL: '10' is not a duration (e.g. 100ms, 10s, 1m30s)",
        ),
        (
            {"GRPC_MAX_CONNECTION_AGE": "1d"},
            "GRPC_MAX_CONNECTION_AGE: '1d' is not a duration (e.g. 100ms, 10s, 1m30s)",
        ),
        (
            {"GRPC_MAX_CONNECTION_AGE_GRACE": "-1s"},
            "GRPC_MAX_CONNECTION_AGE_GRACE: '-1s' may not be negative",
        ),
    ],
)  # fmt: skip
def test_bad_upstream_values_name_their_variable(environ: dict, message: str) -> None:
    with pytest.raises(ValueError) as info:
        from_arguments(parse(), environ)
    assert str(info.value) == message


def test_host_alone_does_not_move_the_grpc_port() -> None:
    # Upstream binds only HTTP to HOST; its gRPC port stays on GRPC_HOST's 0.0.0.0.
    settings, sources = resolve(parse(), {"HOST": "127.0.0.1"})
    assert (settings.host, sources["host"]) == ("0.0.0.0", "default")


def test_flags_and_sluice_variables_beat_upstream_ones() -> None:
    environ = {"GRPC_PORT": "1", "SLUICE_GRPC_PORT": "2", "PORT": "3", "SLUICE_HTTP_PORT": "4"}
    settings, sources = resolve(parse("--grpc-port", "5"), environ)
    assert (settings.grpc_port, sources["grpc_port"]) == (5, "--grpc-port")
    assert (settings.http_port, sources["http_port"]) == (4, "SLUICE_HTTP_PORT")


@pytest.mark.parametrize(
    ("argv", "environ", "setting", "value"),
    [
        ((), {"SLUICE_REDIS_URL": "redis://mine:1/0", "REDIS_URL": "up:2"}, "redis_url", "redis://mine:1/0"),
        (("--redis-key-prefix", "mine:"), {"CACHE_KEY_PREFIX": "rl_"}, "redis_key_prefix", "mine:"),
        ((), {"SLUICE_LOG_LEVEL": "ERROR", "LOG_LEVEL": "debug"}, "log_level", "ERROR"),
        ((), {"SLUICE_CONFIG": "/mine", "RUNTIME_ROOT": "/data"}, "config", "/mine"),
        # An upstream value Sluice's own name overrides is not even read: it cannot stop a start.
        ((), {"SLUICE_BACKEND": "memory", "BACKEND_TYPE": "memcache"}, "backend", "memory"),
        (("--no-local-cache",), {"LOCAL_CACHE_SIZE_IN_BYTES": "1024"}, "local_cache", False),
    ],
)  # fmt: skip
def test_sluice_names_win(argv: tuple, environ: dict, setting: str, value: Any) -> None:
    assert getattr(from_arguments(parse(*argv), environ), setting) == value


@pytest.mark.parametrize(
    ("argv", "environ", "value", "source"),
    [
        # Redis set up as upstream's: its local cache is off unless given a size.
        ((), {"REDIS_URL": "up:2"}, False, "upstream default (LOCAL_CACHE_SIZE_IN_BYTES unset: "
         "upstream's local cache is off)"),
        ((), {"REDIS_URL": "up:2", "LOCAL_CACHE_SIZE_IN_BYTES": "0"}, False,
         "upstream LOCAL_CACHE_SIZE_IN_BYTES"),
        ((), {"REDIS_URL": "up:2", "LOCAL_CACHE_SIZE_IN_BYTES": "1024"}, True,
         "upstream LOCAL_CACHE_SIZE_IN_BYTES"),
        # Sluice's own names keep Sluice's meaning, and its default where Redis is its own.
        ((), {"REDIS_URL": "up:2", "SLUICE_LOCAL_CACHE": "true"}, True, "SLUICE_LOCAL_CACHE"),
        (("--local-cache",), {"REDIS_URL": "up:2"}, True, "--local-cache"),
        ((), {"SLUICE_REDIS_URL": "redis://mine:1/0"}, True, "default"),
        ((), {"SLUICE_REDIS_URL": "redis://mine:1/0", "REDIS_URL": "up:2"}, True, "default"),
        ((), {"LOG_LEVEL": "warn"}, True, "default"),
    ],
)  # fmt: skip
def test_the_local_cache_defaults_as_upstream_where_redis_is_set_up_as_upstream(
    argv: tuple, environ: dict, value: bool, source: str
) -> None:
    settings, sources = resolve(parse(*argv), environ)
    assert (settings.local_cache, sources["local_cache"]) == (value, source)


def test_a_sluice_secret_file_beats_upstream(tmp_path: Path) -> None:
    url = tmp_path / "url"
    url.write_text("redis://from-file:1/0\n")
    environ = {"SLUICE_REDIS_URL_FILE": str(url), "REDIS_URL": "up:2"}
    settings, sources = resolve(parse(), environ)
    assert (settings.redis_url, sources["redis_url"]) == (
        "redis://from-file:1/0",
        "SLUICE_REDIS_URL_FILE",
    )


# A value each not-honoured variable is named for ("true" unless listed).
APPLYING = {
    "HOST": {"HOST": "127.0.0.1"},  # upstream's gRPC port stays on 0.0.0.0; Sluice's too
    "PROTO": {"PROTO": "udp"},
    "CONFIG_TYPE": {"CONFIG_TYPE": "GRPC_XDS_SOTW"},
    "FORCE_START_WITHOUT_INITIAL_CONFIG": {"FORCE_START_WITHOUT_INITIAL_CONFIG": "false"},
    "RUNTIME_IGNOREDOTFILES": {"RUNTIME_IGNOREDOTFILES": "false"},
    "LOCAL_CACHE_SIZE_IN_BYTES": {"LOCAL_CACHE_SIZE_IN_BYTES": "1048576"},
}


@pytest.mark.parametrize("row", NOT_HONOURED, ids=lambda row: row.name)
def test_each_variable_not_honoured_is_named_in_the_warning_line(row: Any) -> None:
    environ = APPLYING.get(row.name, {row.name: "true"})
    assert warning_line(environ) == (
        f"upstream settings recognised but not honoured: {row.name} ({row.reason})"
    )


@pytest.mark.parametrize(
    "environ",
    [
        {"USE_STATSD": "false"},
        {"USE_DOG_STATSD": "false"},
        {"USE_PROMETHEUS": "false"},
        {"PROTO": "tcp"},
        {"CONFIG_TYPE": "FILE"},
        {"FORCE_START_WITHOUT_INITIAL_CONFIG": "true"},
        {"RUNTIME_IGNOREDOTFILES": "true"},
        {"HOST": "10.0.0.1", "GRPC_HOST": "10.0.0.1"},
        {"HOST": "0.0.0.0"},  # GRPC_HOST's default too
        {"LOCAL_CACHE_SIZE_IN_BYTES": "0"},
        {"MERGE_DOMAIN_CONFIG": "false"},
        {"STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT": "false"},
        {"LIMIT_RESPONSE_HEADERS_ENABLED": "false"},
        {"SHADOW_MODE": "true", "REDIS_URL": "r:1", "GRPC_PORT": "1", "LOG_FORMAT": "json"},
    ],
)
def test_what_sluice_does_as_upstream_is_not_named(environ: dict[str, str]) -> None:
    assert warning_line(environ) is None


def test_the_warning_is_one_line_naming_each_variable_once() -> None:
    environ = {"USE_PROMETHEUS": "true", "GRPC_UDS": "s", "DEBUG_PORT": "6070", "PATH": "/bin"}
    line = warning_line(environ)
    assert line is not None and "\n" not in line
    assert re.findall(r"([A-Z_]+) \(", line) == ["DEBUG_PORT", "GRPC_UDS", "USE_PROMETHEUS"]


@pytest.mark.parametrize(
    ("text", "ms"),
    [("10s", 10000.0), ("1.5s", 1500.0), ("1h2m3s", 3723000.0), ("100ms", 100.0), ("0", 0.0),
     ("250µs", 0.25), ("2us", 0.002), ("-1s", -1000.0)],
)  # fmt: skip
def test_go_durations(text: str, ms: float) -> None:
    assert go_duration_ms("D", text) == pytest.approx(ms)


@pytest.mark.parametrize("text", ["", "10", "s", "1d", "1s 2s", "1.2.3s"])
def test_not_go_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        go_duration_ms("D", text)


def _documented_names() -> dict[str, str]:
    """Each upstream variable in docs/migrating.md's settings table, and its row."""
    section = MIGRATING.read_text().split("## Settings", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            first = re.sub(r"\([^)]*\)", "", line.split(" | ")[0])  # not the defaults
            for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", first):
                rows[name] = line
    return rows


def test_migrating_lists_every_upstream_variable_and_where_it_goes() -> None:
    documented = _documented_names()
    known = {name for row in HONOURED for name in row.names} | {r.name for r in NOT_HONOURED}
    assert sorted(set(documented) - known) == []
    assert sorted(known - set(documented)) == []
    for row in HONOURED:
        for name in row.names:
            assert f"`{flag_name(row.setting)}`" in documented[name], (name, row.setting)
