"""envoyproxy/ratelimit's environment variables, read as upstream reads them.

Two tables. ``HONOURED``: each row is one Sluice setting, the upstream variables it is read
from, and how. ``NOT_HONOURED``: every other upstream variable Sluice recognises, with the
reason it cannot be honoured, named in one warning line when ``sluice serve`` starts (never
silently ignored). ``docs/migrating.md`` lists the same names; a test keeps them in step.

Precedence (``settings.py``): flag, then ``SLUICE_*``, then these, then Sluice's default. A
row is only read when neither a flag nor a ``SLUICE_*`` variable gave its setting, so an
upstream variable that Sluice's own overrides cannot stop a server from starting.

Values are parsed as upstream parses them (Go's ``strconv.ParseBool`` and
``time.ParseDuration``, logrus levels); a bad one raises ValueError naming the variable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote

__all__ = [
    "HONOURED",
    "NOT_HONOURED",
    "Honoured",
    "NotHonoured",
    "UPSTREAM_DEFAULTS",
    "go_duration_ms",
    "not_honoured",
    "upstream_value",
    "warning_line",
]

Reader = Callable[[Mapping[str, str]], Any]


@dataclass(frozen=True)
class Honoured:
    """``setting`` read from upstream's ``names``: ``read`` is given the ones that are set
    (never none) and answers the setting's value, or None when they do not give one."""

    setting: str
    names: tuple[str, ...]
    read: Reader


@dataclass(frozen=True)
class NotHonoured:
    """``name`` recognised but not honoured, for ``reason``; named when ``applies`` is true of
    its value (by default: whenever it is set)."""

    name: str
    reason: str
    applies: Callable[[str, Mapping[str, str]], bool] = lambda value, environ: True


# -- how upstream reads values ------------------------------------------------------------

_GO_TRUE = ("1", "t", "true")
_GO_FALSE = ("0", "f", "false")


def _go_bool(name: str, text: str) -> bool:
    """Go's ``strconv.ParseBool``, which upstream's envconfig uses."""
    lowered = text.strip().lower()
    if lowered in _GO_TRUE:
        return True
    if lowered in _GO_FALSE:
        return False
    raise ValueError(f"{name}: '{text}' is not a valid bool")


def _true(text: str, environ: Mapping[str, str]) -> bool:
    return text.strip().lower() in _GO_TRUE


def _false(text: str, environ: Mapping[str, str]) -> bool:
    return text.strip().lower() in _GO_FALSE


_DURATION_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_MS_PER_UNIT = {
    "ns": 1e-6, "us": 1e-3, "µs": 1e-3, "μs": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4, "h": 3.6e6,
}  # fmt: skip


def go_duration_ms(name: str, text: str) -> float:
    """Go's ``time.ParseDuration`` (``10s``, ``1m30s``, ``250ms``), in milliseconds."""
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    body = body.lstrip("+-")
    if body == "0":
        return 0.0
    parts = _DURATION_PART.findall(body)
    if not body or "".join(number + unit for number, unit in parts) != body:
        raise ValueError(f"{name}: '{text}' is not a duration (e.g. 100ms, 10s, 1m30s)")
    return sign * sum(float(number) * _MS_PER_UNIT[unit] for number, unit in parts)


# logrus level names (upstream's logger) -> Python's.
_LOG_LEVELS = {
    "trace": "DEBUG", "debug": "DEBUG", "info": "INFO", "warn": "WARNING", "warning": "WARNING",
    "error": "ERROR", "fatal": "CRITICAL", "panic": "CRITICAL",
}  # fmt: skip


# -- readers: the set upstream variables of one row -> the Sluice setting's value ------------


def _text(name: str) -> Reader:
    return lambda env: env[name]


def _bool(name: str) -> Reader:
    return lambda env: _go_bool(name, env[name])


def _backend(env: Mapping[str, str]) -> str:
    backend = env.get("BACKEND_TYPE", "redis").strip().lower()  # upstream's default: redis
    if backend == "memcache":
        raise ValueError(
            "BACKEND_TYPE: memcache is not supported: Sluice keeps counters in Redis "
            "(BACKEND_TYPE=redis with REDIS_URL) or in memory"
        )
    if backend != "redis":
        raise ValueError(f"BACKEND_TYPE: unknown backend '{backend}' (redis)")
    return backend


_REDIS_URL_PARTS = ("REDIS_URL", "REDIS_TYPE", "REDIS_SOCKET_TYPE", "REDIS_AUTH", "REDIS_TLS")


def _redis_url(env: Mapping[str, str]) -> str:
    """Upstream's ``REDIS_URL`` (``host:port``, or comma lists for sentinel and cluster) with
    ``REDIS_TYPE``, ``REDIS_AUTH`` and ``REDIS_TLS``, as one of Sluice's Redis URLs."""
    if "REDIS_URL" not in env:
        given = ", ".join(name for name in _REDIS_URL_PARTS if name in env)
        raise ValueError(
            f"{given}: set REDIS_URL too (upstream's default, the unix socket "
            "/var/run/nutcracker/ratelimit.sock, is not supported)"
        )
    url = env["REDIS_URL"].strip()
    if "://" in url:  # already one of Sluice's URLs
        return url
    socket_type = env.get("REDIS_SOCKET_TYPE", "unix" if url.startswith("/") else "tcp")
    socket_type = socket_type.strip().lower()
    if socket_type == "unix":
        raise ValueError(
            "REDIS_SOCKET_TYPE: Redis over a unix socket is not supported; "
            "use REDIS_SOCKET_TYPE=tcp and REDIS_URL=HOST:PORT"
        )
    if socket_type != "tcp":
        raise ValueError(f"REDIS_SOCKET_TYPE: '{socket_type}' is not tcp or unix")
    tls = _go_bool("REDIS_TLS", env["REDIS_TLS"]) if "REDIS_TLS" in env else False
    userinfo = ""
    if env.get("REDIS_AUTH"):
        # "password" or "username:password", as upstream reads it.
        user, colon, password = env["REDIS_AUTH"].partition(":")
        if not colon:
            user, password = "", user
        userinfo = f"{quote(user, safe='')}:{quote(password, safe='')}@"
    items = [item.strip() for item in url.split(",") if item.strip()]
    redis_type = env.get("REDIS_TYPE", "single").strip().lower()
    scheme = "rediss" if tls else "redis"
    if redis_type == "single":
        if len(items) != 1:
            raise ValueError("REDIS_URL: REDIS_TYPE=single takes one HOST:PORT")
        return f"{scheme}://{userinfo}{items[0]}"
    if redis_type == "sentinel":
        if len(items) < 2:
            raise ValueError(
                "REDIS_URL: REDIS_TYPE=sentinel takes MASTER_NAME,HOST:PORT[,HOST:PORT...]"
            )
        return f"{scheme}+sentinel://{userinfo}{','.join(items[1:])}/{items[0]}"
    if redis_type == "cluster":
        if not items:
            raise ValueError("REDIS_URL: REDIS_TYPE=cluster takes HOST:PORT[,HOST:PORT...]")
        return f"{scheme}+cluster://{userinfo}{','.join(items)}"
    raise ValueError(f"REDIS_TYPE: '{redis_type}' is not single, sentinel or cluster")


def _redis_timeout_ms(env: Mapping[str, str]) -> int:
    ms = go_duration_ms("REDIS_TIMEOUT", env["REDIS_TIMEOUT"])
    if ms <= 0:
        raise ValueError(f"REDIS_TIMEOUT: '{env['REDIS_TIMEOUT']}' must be above 0")
    return max(1, round(ms))


def _local_cache(env: Mapping[str, str]) -> bool:
    text = env["LOCAL_CACHE_SIZE_IN_BYTES"].strip()
    if not text.isdigit():
        raise ValueError(f"LOCAL_CACHE_SIZE_IN_BYTES: '{text}' is not a valid int")
    return int(text) > 0  # upstream: 0 disables the local cache


def _log_level(env: Mapping[str, str]) -> str:
    text = env["LOG_LEVEL"]
    try:
        return _LOG_LEVELS[text.strip().lower()]
    except KeyError:
        raise ValueError(
            f"LOG_LEVEL: '{text}' is not one of {', '.join(sorted(_LOG_LEVELS))}"
        ) from None


def _log_format(env: Mapping[str, str]) -> str:
    text = env["LOG_FORMAT"].strip().lower()
    if text not in ("text", "json"):
        raise ValueError(f"LOG_FORMAT: '{env['LOG_FORMAT']}' is not text or json")
    return text


def _config_dir(env: Mapping[str, str]) -> str:
    """``RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY``, upstream's defaults for the
    parts not given (whichever of ``RUNTIME_WATCH_ROOT``'s modes: both read these files)."""
    root = env.get("RUNTIME_ROOT", "/srv/runtime_data/current")
    return str(
        PurePosixPath(root, env.get("RUNTIME_SUBDIRECTORY", ""))
        / env.get("RUNTIME_APPDIRECTORY", "config")
    )


def _watch_root(env: Mapping[str, str]) -> None:
    """Upstream's two modes differ only in what makes it reload (the root's symlink swapped,
    or any file below written); Sluice checks the files' contents, which both change: either
    value is honoured by watching as usual (a bad one is still refused)."""
    _go_bool("RUNTIME_WATCH_ROOT", env["RUNTIME_WATCH_ROOT"])
    return None


def _seconds(name: str) -> Reader:
    """A Go duration, as seconds (upstream's connection ages: ``24h``, ``1h``)."""

    def read(env: Mapping[str, str]) -> float:
        ms = go_duration_ms(name, env[name])
        if ms < 0:
            raise ValueError(f"{name}: '{env[name]}' may not be negative")
        return ms / 1000

    return read


def _grpc_tls(name: str) -> Reader:
    """A server TLS file, used (as upstream uses it) only with ``GRPC_SERVER_USE_TLS``."""

    def read(env: Mapping[str, str]) -> str | None:
        use = env.get("GRPC_SERVER_USE_TLS", "false")
        return env.get(name) if _go_bool("GRPC_SERVER_USE_TLS", use) else None

    return read


_STATSD_PARTS = ("USE_STATSD", "USE_DOG_STATSD", "STATSD_HOST", "STATSD_PORT", "DISABLE_STATS")


def _statsd_address(env: Mapping[str, str]) -> str | None:
    """Upstream sends statsd (``USE_STATSD`` defaults to true) to ``STATSD_HOST``:
    ``STATSD_PORT`` (localhost:8125). Sluice does when any of these four is set: a Deployment
    that names a statsd destination, or turns statsd on, gets it; one that says nothing
    does not. ``DISABLE_STATS=true`` turns it off, as upstream."""
    if "DISABLE_STATS" in env and _go_bool("DISABLE_STATS", env["DISABLE_STATS"]):
        return None
    statsd = _go_bool("USE_STATSD", env["USE_STATSD"]) if "USE_STATSD" in env else True
    dog = _go_bool("USE_DOG_STATSD", env["USE_DOG_STATSD"]) if "USE_DOG_STATSD" in env else False
    if dog and "USE_STATSD" in env and statsd:
        raise ValueError("USE_STATSD, USE_DOG_STATSD: set one of them, not both (as upstream)")
    if not (statsd or dog):
        return None  # off: Sluice's default
    port = env.get("STATSD_PORT", "8125").strip()
    if not port.isdigit():
        raise ValueError(f"STATSD_PORT: '{env['STATSD_PORT']}' is not a valid int")
    return f"{env.get('STATSD_HOST', 'localhost').strip()}:{port}"


def _statsd_protocol(env: Mapping[str, str]) -> str | None:
    """lyft/gostats, upstream's statsd client, sends over TCP unless ``STATSD_PROTOCOL``
    says udp: so does Sluice when statsd is on through upstream's variables."""
    if _statsd_address(env) is None:
        return None
    protocol = env.get("STATSD_PROTOCOL", "tcp").strip().lower()
    if protocol not in ("tcp", "udp"):
        raise ValueError(f"STATSD_PROTOCOL: '{env['STATSD_PROTOCOL']}' is not tcp or udp")
    return protocol


def _statsd_flavor(env: Mapping[str, str]) -> str:
    return "dogstatsd" if _go_bool("USE_DOG_STATSD", env["USE_DOG_STATSD"]) else "statsd"


def _statsd_flush_interval_s(env: Mapping[str, str]) -> float:
    ms = go_duration_ms("STATS_FLUSH_INTERVAL", env["STATS_FLUSH_INTERVAL"])
    if ms <= 0:
        raise ValueError(f"STATS_FLUSH_INTERVAL: '{env['STATS_FLUSH_INTERVAL']}' must be above 0")
    return ms / 1000


HONOURED: tuple[Honoured, ...] = (
    Honoured(
        "config", ("RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"), _config_dir
    ),
    Honoured("config_watch_interval_s", ("RUNTIME_WATCH_ROOT",), _watch_root),
    Honoured("merge_domain_config", ("MERGE_DOMAIN_CONFIG",), _bool("MERGE_DOMAIN_CONFIG")),
    # Sluice binds both ports to one address: gRPC's, the one Envoy calls (HOST: warned).
    Honoured("host", ("GRPC_HOST",), _text("GRPC_HOST")),
    Honoured("grpc_port", ("GRPC_PORT",), _text("GRPC_PORT")),
    Honoured("http_port", ("PORT",), _text("PORT")),
    Honoured(
        "tls_cert_file",
        ("GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_CERT"),
        _grpc_tls("GRPC_SERVER_TLS_CERT"),
    ),
    Honoured(
        "tls_key_file",
        ("GRPC_SERVER_USE_TLS", "GRPC_SERVER_TLS_KEY"),
        _grpc_tls("GRPC_SERVER_TLS_KEY"),
    ),
    Honoured(
        "tls_client_ca_file",
        ("GRPC_SERVER_USE_TLS", "GRPC_CLIENT_TLS_CACERT"),
        _grpc_tls("GRPC_CLIENT_TLS_CACERT"),
    ),
    Honoured(
        "grpc_max_connection_age_s",
        ("GRPC_MAX_CONNECTION_AGE",),
        _seconds("GRPC_MAX_CONNECTION_AGE"),
    ),
    Honoured(
        "grpc_max_connection_age_grace_s",
        ("GRPC_MAX_CONNECTION_AGE_GRACE",),
        _seconds("GRPC_MAX_CONNECTION_AGE_GRACE"),
    ),
    Honoured("backend", ("BACKEND_TYPE", "REDIS_URL"), _backend),
    Honoured("redis_url", _REDIS_URL_PARTS, _redis_url),
    Honoured("redis_tls_ca_file", ("REDIS_TLS_CACERT",), _text("REDIS_TLS_CACERT")),
    Honoured("redis_tls_cert_file", ("REDIS_TLS_CLIENT_CERT",), _text("REDIS_TLS_CLIENT_CERT")),
    Honoured("redis_tls_key_file", ("REDIS_TLS_CLIENT_KEY",), _text("REDIS_TLS_CLIENT_KEY")),
    Honoured("redis_key_prefix", ("CACHE_KEY_PREFIX",), _text("CACHE_KEY_PREFIX")),
    Honoured("redis_timeout_ms", ("REDIS_TIMEOUT",), _redis_timeout_ms),
    Honoured("redis_pool_size", ("REDIS_POOL_SIZE",), _text("REDIS_POOL_SIZE")),
    Honoured("local_cache", ("LOCAL_CACHE_SIZE_IN_BYTES",), _local_cache),
    Honoured("global_shadow_mode", ("SHADOW_MODE",), _bool("SHADOW_MODE")),
    Honoured(
        "response_headers",
        ("LIMIT_RESPONSE_HEADERS_ENABLED",),
        _bool("LIMIT_RESPONSE_HEADERS_ENABLED"),
    ),
    Honoured("near_limit_ratio", ("NEAR_LIMIT_RATIO",), _text("NEAR_LIMIT_RATIO")),
    Honoured("log_level", ("LOG_LEVEL",), _log_level),
    Honoured("log_format", ("LOG_FORMAT",), _log_format),
    Honoured("statsd_address", _STATSD_PARTS, _statsd_address),
    Honoured("statsd_protocol", ("STATSD_PROTOCOL", *_STATSD_PARTS), _statsd_protocol),
    Honoured("statsd_flavor", ("USE_DOG_STATSD",), _statsd_flavor),
    Honoured("statsd_tags", ("EXTRA_TAGS",), _text("EXTRA_TAGS")),
    Honoured("statsd_flush_interval_s", ("STATS_FLUSH_INTERVAL",), _statsd_flush_interval_s),
)

# Settings whose default upstream does not share, and which change what a server set up from
# upstream's variables does: upstream's default, and why, for a server whose Redis is
# upstream's (REDIS_URL, ...) when neither Sluice's names nor upstream's variable give it.
UPSTREAM_DEFAULTS: dict[str, tuple[Any, str]] = {
    # Sluice's own default is on; upstream's cache is off unless given a size.
    "local_cache": (False, "LOCAL_CACHE_SIZE_IN_BYTES unset: upstream's local cache is off"),
}

_XDS = "xDS configuration is not supported: publish with sluice import or the write API"
_PER_SECOND = "not needed: one Redis (REDIS_URL) holds every limit"
_MEMCACHE = "memcache is not supported"
_TRACING = "tracing is not supported"

NOT_HONOURED: tuple[NotHonoured, ...] = (
    NotHonoured(
        "HOST",
        "both ports bind GRPC_HOST's address (default 0.0.0.0): Sluice has one",
        lambda v, env: v.strip() != env.get("GRPC_HOST", "0.0.0.0").strip(),
    ),
    NotHonoured("PROTO", "Sluice listens on TCP only", lambda v, env: v.strip().lower() != "tcp"),
    NotHonoured("DEBUG_HOST", "no debug port: /rlconfig and /metrics are on PORT"),
    NotHonoured("DEBUG_PORT", "no debug port: /rlconfig and /metrics are on PORT"),
    NotHonoured("GRPC_UDS", "gRPC on a unix socket is not supported"),
    NotHonoured(
        "GRPC_SERVER_USE_TLS", "TLS covers the HTTP port too: HTTP health probes need HTTPS", _true
    ),
    NotHonoured("GRPC_CLIENT_TLS_SAN", "client certificates are checked against the CA only"),
    NotHonoured("CONFIG_TYPE", _XDS, lambda v, env: v.strip().upper() != "FILE"),
    NotHonoured(
        "FORCE_START_WITHOUT_INITIAL_CONFIG",
        "Sluice starts without policies and serves them once published",
        _false,
    ),
    *(
        NotHonoured(f"CONFIG_GRPC_XDS_{name}", _XDS)
        for name in (
            "NODE_ID",
            "NODE_METADATA",
            "SERVER_URL",
            "SERVER_CONNECT_RETRY_INTERVAL",
            "CLIENT_ADDITIONAL_HEADERS",
            "SERVER_USE_TLS",
            "CLIENT_TLS_CERT",
            "CLIENT_TLS_KEY",
            "SERVER_TLS_CACERT",
            "SERVER_TLS_SAN",
        )  # fmt: skip
    ),
    *(
        NotHonoured(f"XDS_CLIENT_BACKOFF_{name}", _XDS)
        for name in ("INITIAL_INTERVAL", "MAX_INTERVAL", "RANDOM_FACTOR", "JITTER")
    ),
    NotHonoured(
        "USE_DOG_STATSD_MOGRIFIERS", "metric names are not rewritten into tags: names as upstream"
    ),
    NotHonoured("DISABLE_STATS", "/metrics is always served on PORT (statsd is off)", _true),
    NotHonoured(
        "USE_PROMETHEUS", "metrics are served at /metrics on PORT, not PROMETHEUS_ADDR", _true
    ),
    NotHonoured("PROMETHEUS_ADDR", "metrics are served at /metrics on PORT"),
    NotHonoured("PROMETHEUS_PATH", "metrics are served at /metrics on PORT"),
    NotHonoured("PROMETHEUS_MAPPER_YAML", "Sluice's Prometheus metrics have their own names"),
    NotHonoured(
        "RUNTIME_IGNOREDOTFILES", "hidden files and directories are never read as policies", _false
    ),
    NotHonoured("EXPIRATION_JITTER_MAX_SECONDS", "keys expire when their state stops mattering"),
    NotHonoured(
        "LOCAL_CACHE_SIZE_IN_BYTES",
        "the size: the local cache is sized in keys (SLUICE_LOCAL_CACHE_MAX_KEYS)",
        lambda v, env: v.strip().isdigit() and int(v) > 0,
    ),
    NotHonoured(
        "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", "not supported yet: over-limit hits count", _true
    ),
    NotHonoured(
        "LIMIT_RESPONSE_HEADERS_ENABLED",
        "Sluice adds RateLimit-Policy, RateLimit and Retry-After (IETF draft), "
        "not RateLimit-Limit/-Remaining/-Reset",
        _true,
    ),
    NotHonoured("LIMIT_LIMIT_HEADER", "header names are fixed"),
    NotHonoured("LIMIT_REMAINING_HEADER", "header names are fixed"),
    NotHonoured("LIMIT_RESET_HEADER", "header names are fixed"),
    NotHonoured("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "not supported yet", _true),
    NotHonoured("REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", "not supported", _true),
    NotHonoured("REDIS_PIPELINE_WINDOW", "not needed: concurrent requests share round trips"),
    NotHonoured("REDIS_PIPELINE_LIMIT", "not needed: concurrent requests share round trips"),
    NotHonoured("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "not supported yet", _true),
    NotHonoured("REDIS_PERSECOND", _PER_SECOND, _true),
    *(
        NotHonoured(f"REDIS_PERSECOND_{name}", _PER_SECOND)
        for name in (
            "SOCKET_TYPE",
            "TYPE",
            "URL",
            "POOL_SIZE",
            "AUTH",
            "TLS",
            "TIMEOUT",
            "PIPELINE_WINDOW",
            "PIPELINE_LIMIT",
        )  # fmt: skip
    ),
    *(
        NotHonoured(f"MEMCACHE_{name}", _MEMCACHE)
        for name in (
            "HOST_PORT",
            "MAX_IDLE_CONNS",
            "SRV",
            "SRV_REFRESH",
            "TLS",
            "TLS_CLIENT_CERT",
            "TLS_CLIENT_KEY",
            "TLS_CACERT",
            "TLS_SKIP_HOSTNAME_VERIFICATION",
        )  # fmt: skip
    ),
    NotHonoured("RESPONSE_DYNAMIC_METADATA", "not supported yet", _true),
    *(
        NotHonoured(f"TRACING_{name}", _TRACING)
        for name in (
            "ENABLED",
            "SERVICE_NAME",
            "SERVICE_NAMESPACE",
            "SERVICE_INSTANCE_ID",
            "EXPORTER_PROTOCOL",
            "SAMPLING_RATE",
        )  # fmt: skip
    ),
)

_BY_SETTING = {row.setting: row for row in HONOURED}


def upstream_value(setting: str, environ: Mapping[str, str]) -> tuple[Any, str] | None:
    """``setting``'s value from upstream's variables in ``environ`` and the names it came
    from (``"REDIS_URL, REDIS_TYPE"``), or None when none of them gives one."""
    row = _BY_SETTING.get(setting)
    if row is None:
        return None
    given = {name: environ[name] for name in row.names if name in environ}
    if not given:
        return None
    value = row.read(given)
    return None if value is None else (value, ", ".join(given))


def not_honoured(environ: Mapping[str, str]) -> list[tuple[str, str]]:
    """The upstream variables set in ``environ`` that Sluice cannot honour, and why."""
    return [
        (row.name, row.reason)
        for row in NOT_HONOURED
        if row.name in environ and row.applies(environ[row.name], environ)
    ]


def warning_line(environ: Mapping[str, str]) -> str | None:
    """The one warning line naming what ``not_honoured`` found, or None."""
    found = not_honoured(environ)
    if not found:
        return None
    named = "; ".join(f"{name} ({reason})" for name, reason in found)
    return f"upstream settings recognised but not honoured: {named}"
