"""Every setting, once: a command-line flag and a ``SLUICE_*`` environment variable, and for
many also envoyproxy/ratelimit's own variable (``upstream_env.py``): one setting underneath
each name.

Precedence: flag, then ``SLUICE_*``, then upstream's variable, then default: Sluice's, or
upstream's where it differs and Redis is set up by upstream's variables
(``upstream_env.UPSTREAM_DEFAULTS``: the local over-limit cache). ``resolve`` also says which
of them each value came from (``sluice settings`` prints it).
``docs/configuration.md`` lists the same table; a test keeps the two in step.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from sluice import upstream_env
from sluice.bounds import RequestBounds

__all__ = [
    "BACKENDS",
    "LOG_FORMATS",
    "TRANSPORTS",
    "Settings",
    "add_arguments",
    "from_arguments",
    "resolve",
]

BACKENDS = ("memory", "redis")
TRANSPORTS = ("grpcio", "pyvoy")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "WARN", "ERROR", "CRITICAL")
DEFAULT = "default"
REDIS_CLIENTS = ("lean", "redis-py")


def _setting(default: Any, help: str, *, secret: bool = False) -> Any:
    return field(default=default, metadata={"help": help, "secret": secret})


@dataclass(frozen=True)
class Settings:
    database_url: str = _setting(
        "sqlite:///sluice.db",
        "Config database: sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DB.",
        secret=True,
    )
    config: str = _setting(
        "",
        "sluice serve: YAML file or directory of policies imported into the config database "
        "before serving (a domain whose rules did not change is left as it is), then watched.",
    )
    config_watch_interval_s: float = _setting(
        1.0,
        "sluice serve --config: how often the files are checked; a change is validated and "
        "published (an invalid one is logged and the last good version serves). 0: read once.",
    )
    merge_domain_config: bool = _setting(
        False,
        "Several files may define one domain: their top-level descriptors are merged "
        "(envoyproxy/ratelimit's MERGE_DOMAIN_CONFIG); else a second definition is refused.",
    )
    host: str = _setting("0.0.0.0", "Address both ports bind to.")
    grpc_port: int = _setting(8081, "gRPC port (ShouldRateLimit, health, reflection).")
    http_port: int = _setting(8080, "HTTP port (/healthcheck, /json).")
    management_port: int = _setting(
        0,
        "Management port: /healthcheck (liveness), /ready (readiness) and /metrics, always "
        "plaintext, also when the other ports use TLS (for kubelet probes and Prometheus); "
        "0: none.",
    )
    management_host: str = _setting("0.0.0.0", "Address the management port binds to.")
    grpc_max_connection_age_s: float = _setting(
        0.0,
        "Close a gRPC connection this long after it opened (GOAWAY: the client reconnects, "
        "to a newer instance too); 0: never.",
    )
    grpc_max_connection_age_grace_s: float = _setting(
        0.0,
        "After a connection's maximum age: how long its calls in flight may take before it is "
        "closed; 0: no limit.",
    )
    transport: str = _setting(
        "pyvoy",
        "What serves the gRPC port: pyvoy (Envoy's HTTP/2 running Sluice's gRPC-over-ASGI edge, "
        "about a fifth of grpc.aio's CPU per call) or grpcio (grpc.aio, no Envoy process); TLS "
        "from the same --tls-* flags on both.",
    )
    tls_cert_file: str = _setting(
        "", "PEM certificate chain both ports present; with --tls-key-file, TLS on both ports."
    )
    tls_key_file: str = _setting("", "PEM private key of --tls-cert-file.")
    tls_client_ca_file: str = _setting(
        "", "PEM CA bundle; when set, both ports refuse clients without a certificate it signed."
    )
    tls_watch_interval_s: float = _setting(
        1.0,
        "How often the TLS files (--tls-*, --redis-tls-*) are checked; a changed certificate is "
        "used for new connections, an invalid one is logged and the previous one serves on. "
        "0: read once.",
    )
    backend: str = _setting("memory", "Where algorithm state lives: memory or redis.")
    memory_max_keys: int = _setting(
        1_000_000, "Memory backend: most counters kept; the least recently used is evicted."
    )
    redis_url: str = _setting(
        "redis://127.0.0.1:6379/0",
        "Redis backend: redis://, rediss:// (TLS), redis+sentinel://HOSTS/SERVICE[/DB] or "
        "redis+cluster://HOSTS; HOSTS is HOST:PORT[,HOST:PORT...].",
        secret=True,
    )
    redis_tls_ca_file: str = _setting(
        "", "Redis backend over TLS: PEM CA bundle that signed Redis's certificate (else system)."
    )
    redis_tls_cert_file: str = _setting(
        "", "Redis backend over TLS: PEM client certificate, for a Redis that asks for one."
    )
    redis_tls_key_file: str = _setting("", "Redis backend over TLS: the client certificate's key.")
    redis_key_prefix: str = _setting("sluice:", "Redis backend: prefix of every key written.")
    redis_timeout_ms: int = _setting(
        100, "Redis backend: connect, read and pool-wait timeout of one round trip."
    )
    redis_pool_size: int = _setting(16, "Redis backend: most connections (per node on Cluster).")
    redis_client: str = _setting(
        "lean",
        "Redis backend, standalone and Sentinel: script calls on a lean RESP connection (lean) "
        "or through redis-py's asyncio client (redis-py, the fallback). Cluster uses redis-py.",
    )
    redis_failure_mode: str = _setting(
        "error",
        "Redis backend unreachable: error (gRPC UNAVAILABLE, Envoy decides), allow or deny.",
    )
    limit_overrides: str = _setting(
        "allow",
        "A descriptor's own limit sent by a client: allow (envoyproxy/ratelimit), ignore (decide "
        "by the rule), deny (INVALID_ARGUMENT). A policy's limit_overrides wins.",
    )
    local_cache: bool = _setting(
        True, "Redis backend: refuse hits on counters known to be over limit without Redis."
    )
    local_cache_max_keys: int = _setting(
        100_000, "Local over-limit cache: most counters remembered (least recently used go)."
    )
    global_shadow_mode: bool = _setting(
        False, "Answer OK overall even when a limit is exceeded; statuses still say OVER_LIMIT."
    )
    response_headers: bool = _setting(
        False, "Add RateLimit-Policy, RateLimit and Retry-After to response_headers_to_add."
    )
    max_domain_length: int = _setting(256, "Longest domain a request may name.")
    max_descriptors: int = _setting(64, "Most descriptors in one request.")
    max_entries: int = _setting(16, "Most entries in one descriptor.")
    max_key_length: int = _setting(256, "Longest entry key.")
    max_value_length: int = _setting(1024, "Longest entry value.")
    http_max_body_bytes: int = _setting(65536, "Largest body the HTTP /json endpoint accepts.")
    http_idle_timeout_s: float = _setting(
        15.0,
        "HTTP and management ports: a connection that has not sent a whole request's headers "
        "this long after it opened or after its last answer is closed (slow headers and idle "
        "keep-alive alike); a /json body must arrive within it too (else 408).",
    )
    http_max_idle_connections: int = _setting(
        1000,
        "HTTP and management ports, each: most idle connections kept (one still sending its "
        "headers counts); past it the one idle longest is closed.",
    )
    api_token: str = _setting(
        "",
        "Bearer token for the HTTP API (/api/v1: policy writes, leases and RLQS buckets); "
        "sluice admin sends it to --admin-servers; empty disables the API.",
        secret=True,
    )
    admin_users: str = _setting(
        "",
        "Admin app users besides those in the database: NAME:ROLE:HASH,... (ROLE viewer, "
        "editor or admin; HASH from sluice admin-user add NAME --print).",
        secret=True,
    )
    admin_servers: str = _setting(
        "",
        "sluice admin: the servers' HTTP ports (http[s]://HOST:PORT,...) whose runtime state "
        "(leases held, RLQS buckets) the Leases and RLQS pages show; empty: none.",
    )
    admin_session_idle_timeout_s: float = _setting(
        1800.0,
        "Admin app: a session without a click or a page change this long ends (every tab of "
        "it shows the sign-in page at its next action). 0: no idle timeout.",
    )
    admin_session_lifetime_s: float = _setting(
        43200.0,
        "Admin app: a session ends this long after its sign-in however busy; its cookie "
        "expires then too.",
    )
    admin_session_secret: str = _setting(
        "",
        "Admin app: key signing the session cookie (32 characters or more); empty: one is "
        "generated and kept in the config database. Changing it ends every session.",
        secret=True,
    )
    admin_oidc_metadata_url: str = _setting(
        "",
        "Admin app single sign-on: the identity provider's OpenID Connect discovery URL "
        "(https://…/.well-known/openid-configuration); empty: passwords only.",
    )
    admin_oidc_client_id: str = _setting("", "Admin app single sign-on: the client id.")
    admin_oidc_client_secret: str = _setting(
        "", "Admin app single sign-on: the client secret.", secret=True
    )
    admin_oidc_redirect_uri: str = _setting(
        "",
        "Admin app single sign-on: the app's own address plus /oauth2callback, as registered "
        "with the identity provider (https://admin.example.com/oauth2callback).",
    )
    admin_oidc_role_claim: str = _setting(
        "groups", "Admin app single sign-on: the ID token claim the role is read from."
    )
    admin_oidc_roles: str = _setting(
        "",
        "Admin app single sign-on: CLAIM_VALUE:ROLE,... (ROLE viewer, editor or admin; the "
        "highest wins when several match); a user matching none is refused.",
    )
    config_poll_interval_s: float = _setting(
        0.25, "How often to check the config database for a published change."
    )
    snapshot_cache: str = _setting(
        "auto",
        "Local copy of the last good policies, served when starting with the database down; "
        "auto: next to a SQLite database, else ./sluice-snapshot.json; empty: none.",
    )
    max_sliding_log_limit: int = _setting(
        10000, "Largest requests_per_unit a sliding_window_log rule may have (memory per key)."
    )
    near_limit_ratio: float = _setting(
        0.8, "Share of a limit used from which a hit counts as near the limit (telemetry)."
    )
    statsd_address: str = _setting(
        "",
        "HOST:PORT to send envoyproxy/ratelimit's statsd metrics to, by UDP (its names, "
        "docs/migrating.md); empty: no statsd.",
    )
    statsd_protocol: str = _setting(
        "udp",
        "udp, or tcp (one connection, newline-terminated lines: upstream's default, "
        "STATSD_PROTOCOL).",
    )
    statsd_flavor: str = _setting(
        "statsd", "statsd, or dogstatsd (tags as |#key:value rather than in the name)."
    )
    statsd_tags: str = _setting("", "Tags added to every statsd metric: KEY:VALUE,...")
    statsd_flush_interval_s: float = _setting(10.0, "How often statsd metrics are sent.")
    usage_flush_interval_s: float = _setting(
        1.0, "How often usage telemetry is flushed to the config database."
    )
    rlqs_assignment_ttl_s: int = _setting(
        15,
        "RLQS: how long a quota assignment holds (whole seconds) unless refreshed; Sluice "
        "refreshes it while the data plane reports, and a data plane that loses Sluice keeps "
        "enforcing it this long.",
    )
    rlqs_max_buckets_per_stream: int = _setting(
        10_000,
        "RLQS: buckets one stream may report; a report past it ends the stream with "
        "RESOURCE_EXHAUSTED.",
    )
    drain_delay_s: float = _setting(
        0.0,
        "On SIGTERM: how long to keep answering while reporting not ready (gRPC health "
        "NOT_SERVING, /ready 503), so load balancers stop sending calls before any is refused.",
    )
    shutdown_grace_s: float = _setting(
        10.0, "On SIGTERM, after --drain-delay-s: how long in-flight calls may take to finish."
    )
    workers: str = _setting(
        "1",
        "Server processes sharing both ports (SO_REUSEPORT), under a supervisor when above 1; "
        "auto: one per CPU this process may run on. Above 1 needs --backend redis; with "
        "--transport pyvoy, one Envoy per worker.",
    )
    access_log_sample_rate: float = _setting(
        0.0,
        "Share of ShouldRateLimit calls (0 to 1) logged on the sluice.access logger at DEBUG: "
        "domain, descriptors, overall code, duration, peer. 0: none; only with --log-level "
        "DEBUG.",
    )
    otel_tracing: bool = _setting(
        False,
        "An OpenTelemetry span per ShouldRateLimit, continuing the caller's trace (needs "
        "sluice[otel]); exported as the standard OTEL_* variables say (OTLP by default).",
    )
    log_level: str = _setting("INFO", "DEBUG, INFO, WARNING or ERROR.")
    log_format: str = _setting(
        "text",
        "text, or json: one JSON object a line with @timestamp, level and @message "
        "(envoyproxy/ratelimit's LOG_FORMAT=json).",
    )

    @property
    def request_bounds(self) -> RequestBounds:
        return RequestBounds(
            max_domain_length=self.max_domain_length,
            max_descriptors=self.max_descriptors,
            max_entries=self.max_entries,
            max_key_length=self.max_key_length,
            max_value_length=self.max_value_length,
        )

    @property
    def worker_count(self) -> int:
        """``workers`` as a number: ``auto`` is the CPUs this process may run on."""
        if self.workers.strip().lower() == "auto":
            return len(os.sched_getaffinity(0))
        return int(self.workers)

    @property
    def snapshot_cache_path(self) -> Path | None:
        if not self.snapshot_cache:
            return None
        if self.snapshot_cache != "auto":
            return Path(self.snapshot_cache)
        prefix = "sqlite:///"
        if self.database_url.startswith(prefix) and len(self.database_url) > len(prefix):
            database = Path(self.database_url[len(prefix) :].split("?")[0])
            return database.with_name(database.name + ".snapshot.json")
        return Path("sluice-snapshot.json")

    def redacted(self) -> dict[str, Any]:
        """The effective settings, with credentials hidden, for logs and ``sluice settings``."""
        from sluice.redaction import REDACTED, redact_url

        out = dataclasses.asdict(self)
        for f in fields(self):
            value = str(out[f.name])
            if f.metadata.get("secret") and value:
                out[f.name] = redact_url(value) if "://" in value else REDACTED
        return out


def env_name(name: str) -> str:
    return "SLUICE_" + name.upper()


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser, only: tuple[str, ...] | None = None) -> None:
    """Add a flag per setting (or per setting in ``only``); unset flags stay None."""
    for f in fields(Settings):
        if only is not None and f.name not in only:
            continue
        help_text = f"{f.metadata['help']} [env {env_name(f.name)}; default {f.default}]"
        if f.type in (bool, "bool"):
            parser.add_argument(
                flag_name(f.name),
                dest=f.name,
                default=None,
                help=help_text,
                action=argparse.BooleanOptionalAction,
            )
        else:
            parser.add_argument(flag_name(f.name), dest=f.name, default=None, help=help_text)
        if f.metadata["secret"]:
            parser.add_argument(
                flag_name(f.name) + "-file",
                dest=f.name + "_file",
                default=None,
                help=f"Read {flag_name(f.name)} from this file [env {env_name(f.name)}_FILE].",
            )


def from_arguments(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> Settings:
    """Settings from parsed flags, then the environment, then defaults; bad values raise
    ValueError naming the flag or the variable."""
    return resolve(args, environ)[0]


def resolve(
    args: argparse.Namespace | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Settings, dict[str, str]]:
    """``from_arguments``, and where each setting came from: ``default``, a flag
    (``--grpc-port``), a variable (``SLUICE_GRPC_PORT``) or upstream's (``upstream PORT``)."""
    environ = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in fields(Settings):
        found = _raw_value(f.name, bool(f.metadata["secret"]), args, environ)
        upstream = None
        if found is None:
            # Only read when Sluice's own names are silent, so they can override a bad one.
            upstream = upstream_env.upstream_value(f.name, environ)
            found = upstream
        if found is None:
            sources[f.name] = DEFAULT
            continue
        raw, origin = found
        values[f.name] = _convert(raw, type(f.default), origin)
        sources[f.name] = f"upstream {origin}" if upstream is not None else origin
    if sources["redis_url"].startswith("upstream "):
        # Redis set up as upstream's: where upstream's default differs, it is upstream's.
        for name, (value, why) in upstream_env.UPSTREAM_DEFAULTS.items():
            if sources[name] == DEFAULT:
                values[name] = value
                sources[name] = f"upstream default ({why})"
    settings = Settings(**values)
    _validate(settings, sources)
    return settings, sources


def _raw_value(
    name: str, secret: bool, args: argparse.Namespace | None, environ: Mapping[str, str]
) -> tuple[Any, str] | None:
    """The raw value of one setting and where it came from, by precedence.

    A secret may also come from a file (``--X-file`` or ``SLUICE_X_FILE``), so that it never
    has to sit in a process's arguments or environment, where ``ps`` and crash dumps show it.
    """
    sources: list[tuple[Any, str, bool]] = [
        (getattr(args, name, None), flag_name(name), False),
        (getattr(args, name + "_file", None), flag_name(name) + "-file", True),
        (environ.get(env_name(name)), env_name(name), False),
        (environ.get(env_name(name) + "_FILE"), env_name(name) + "_FILE", True),
    ]
    for raw, origin, from_file in sources:
        if raw is None or (from_file and not secret):
            continue
        if not from_file:
            return raw, origin
        try:
            # One trailing newline is how editors and `echo` end files; it is not the secret.
            return Path(raw).read_text().removesuffix("\n"), origin
        except OSError as exc:
            raise ValueError(f"{origin}: cannot read {raw}: {exc.strerror}") from None
    return None


def _validate(settings: Settings, sources: Mapping[str, str] | None = None) -> None:
    from sluice.limiter import FAILURE_MODES
    from sluice.model import LIMIT_OVERRIDES
    from sluice.statsd import FLAVORS, PROTOCOLS, parse_tags

    def named(name: str) -> str:
        # A value from upstream's variables is named by them, else by its flag.
        source = (sources or {}).get(name, "")
        return (
            source.removeprefix("upstream ") if source.startswith("upstream ") else flag_name(name)
        )

    if settings.backend not in BACKENDS:
        raise ValueError(
            f"{named('backend')}: unknown backend '{settings.backend}' ({', '.join(BACKENDS)})"
        )
    if settings.transport not in TRANSPORTS:
        raise ValueError(
            f"{named('transport')}: unknown transport '{settings.transport}' "
            f"({', '.join(TRANSPORTS)})"
        )
    if settings.redis_client not in REDIS_CLIENTS:
        raise ValueError(
            f"{flag_name('redis_client')}: '{settings.redis_client}' is not one of "
            f"{', '.join(REDIS_CLIENTS)}"
        )
    if settings.redis_failure_mode not in FAILURE_MODES:
        raise ValueError(
            f"{named('redis_failure_mode')}: '{settings.redis_failure_mode}' is not one of "
            f"{', '.join(FAILURE_MODES)}"
        )
    if settings.limit_overrides not in LIMIT_OVERRIDES:
        raise ValueError(
            f"{named('limit_overrides')}: '{settings.limit_overrides}' is not one of "
            f"{', '.join(LIMIT_OVERRIDES)}"
        )
    if "{" in settings.redis_key_prefix or "}" in settings.redis_key_prefix:
        # Braces would make Redis Cluster hash the prefix instead of the counter.
        raise ValueError(f"{named('redis_key_prefix')}: may not contain '{{' or '}}'")
    for cert, key in (
        ("tls_cert_file", "tls_key_file"),
        ("redis_tls_cert_file", "redis_tls_key_file"),
    ):
        if bool(getattr(settings, cert)) != bool(getattr(settings, key)):
            raise ValueError(f"{named(cert)} and {named(key)}: set both or neither")
    if settings.tls_client_ca_file and not settings.tls_cert_file:
        raise ValueError(
            f"{named('tls_client_ca_file')}: client certificates need TLS: "
            f"set {named('tls_cert_file')} and {named('tls_key_file')} too"
        )
    if settings.config_watch_interval_s < 0:
        raise ValueError(f"{named('config_watch_interval_s')}: must be 0 (off) or more")
    workers = settings.workers.strip().lower()
    if workers != "auto" and (not workers.isdigit() or int(workers) < 1):
        raise ValueError(f"{named('workers')}: '{settings.workers}' is not auto or a number >= 1")
    for name in (
        "admin_session_idle_timeout_s",
        "tls_watch_interval_s",
        "drain_delay_s",
        "grpc_max_connection_age_s",
        "grpc_max_connection_age_grace_s",
        "management_port",
    ):
        if getattr(settings, name) < 0:
            raise ValueError(f"{named(name)}: may not be negative")
    for name in (
        "redis_timeout_ms",
        "redis_pool_size",
        "local_cache_max_keys",
        "rlqs_assignment_ttl_s",
        "rlqs_max_buckets_per_stream",
        "http_max_idle_connections",
    ):
        if getattr(settings, name) < 1:
            raise ValueError(f"{named(name)}: must be at least 1")
    if settings.admin_session_lifetime_s <= 0:
        raise ValueError(f"{named('admin_session_lifetime_s')}: must be more than 0")
    if settings.admin_session_secret and len(settings.admin_session_secret) < 32:
        raise ValueError(f"{named('admin_session_secret')}: must have 32 characters or more")
    if not 0 <= settings.access_log_sample_rate <= 1:
        raise ValueError(f"{named('access_log_sample_rate')}: must be between 0 and 1")
    if settings.log_level.upper() not in LOG_LEVELS:
        raise ValueError(
            f"{named('log_level')}: '{settings.log_level}' is not one of "
            "DEBUG, INFO, WARNING, ERROR or CRITICAL"
        )
    if settings.statsd_address:
        host, colon, port = settings.statsd_address.rpartition(":")
        if not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(
                f"{named('statsd_address')}: '{settings.statsd_address}' is not HOST:PORT"
            )
    if settings.statsd_protocol not in PROTOCOLS:
        raise ValueError(
            f"{named('statsd_protocol')}: '{settings.statsd_protocol}' is not one of "
            f"{', '.join(PROTOCOLS)}"
        )
    if settings.statsd_flavor not in FLAVORS:
        raise ValueError(
            f"{named('statsd_flavor')}: '{settings.statsd_flavor}' is not one of "
            f"{', '.join(FLAVORS)}"
        )
    try:
        parse_tags(settings.statsd_tags)
    except ValueError as exc:
        raise ValueError(f"{named('statsd_tags')}: {exc}") from None
    if settings.http_idle_timeout_s <= 0:
        raise ValueError(f"{named('http_idle_timeout_s')}: must be above 0")
    if settings.statsd_flush_interval_s <= 0:
        raise ValueError(f"{named('statsd_flush_interval_s')}: must be above 0")
    if settings.log_format not in LOG_FORMATS:
        raise ValueError(
            f"{named('log_format')}: '{settings.log_format}' is not one of {', '.join(LOG_FORMATS)}"
        )


def _convert(raw: Any, kind: type, origin: str) -> Any:
    if isinstance(raw, kind):
        return raw
    text = str(raw).strip()
    try:
        if kind is bool:
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError
        return kind(text)
    except ValueError:
        raise ValueError(f"{origin}: '{text}' is not a valid {kind.__name__}") from None
