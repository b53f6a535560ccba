"""Real processes for tests (and bench/): free ports, a `sluice serve` subprocess, a private
redis-server's arguments, waiting for readiness. Standard library only, so the benchmark
scripts import it too."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "SluiceProcess",
    "free_port",
    "redis_server_args",
    "run_sluice",
    "sluice_serve",
    "stop_process",
    "wait_until",
]


def free_port() -> int:
    """A port no socket holds on any address: Envoy binds its listeners to 0.0.0.0, which a
    client's port on another loopback address (127.1.x.y) would refuse."""
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout_s: float, what: str, interval_s: float = 0.05) -> None:
    """Poll ``predicate`` until true; a readiness wait, never a way to pass a race."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval_s)
    raise TimeoutError(f"timed out after {timeout_s}s waiting for {what}")


def stop_process(process: subprocess.Popen[Any], timeout_s: float) -> int:
    """SIGTERM, then SIGKILL if it still runs after ``timeout_s``; its exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def redis_server_args(workdir: Path, port: int | None = None) -> list[str]:
    """``redis-server`` arguments for a private, throw-away server: loopback only, no
    persistence, files in ``workdir`` (``port`` None: the port is set elsewhere)."""
    return [
        *(["--port", str(port)] if port is not None else []),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(workdir),
    ]  # fmt: skip


def run_sluice(args: Sequence[str], **kwargs) -> subprocess.CompletedProcess[str]:
    """Run the ``sluice`` command line (as ``python -m sluice``) to completion."""
    return subprocess.run(
        [sys.executable, "-m", "sluice", *args],
        capture_output=True,
        text=True,
        timeout=60,
        **kwargs,
    )


@dataclass
class SluiceProcess:
    process: subprocess.Popen[str]
    grpc_port: int
    http_port: int
    log_path: Path
    scheme: str = "http"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.http_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def terminate(self, timeout_s: float = 20) -> int:
        return stop_process(self.process, timeout_s)


def _healthy(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url + "/healthcheck", timeout=0.5, context=context) as response:
            return response.status == 200
    except OSError:
        return False


@contextlib.contextmanager
def sluice_serve(
    workdir: Path,
    *,
    config: Path | None = None,
    database_url: str | None = None,
    extra_args: Sequence[str] = (),
    env: dict[str, str] | None = None,
    https: ssl.SSLContext | None = None,
    command_prefix: Sequence[str] = (),
    allowed_tracebacks: Sequence[str] = (),
    exit_code: int = 0,
    upstream_only: bool = False,
    ports: tuple[int, int] | None = None,
) -> Iterator[SluiceProcess]:
    """Start ``sluice serve`` on free loopback ports and stop it (SIGTERM) afterwards.

    A server that logged a traceback, or that did not exit 0 on SIGTERM, fails the test that
    ran it: an error in the server is a bug even when every answer the test saw was right.
    ``allowed_tracebacks``: regular expressions, each matching a traceback's last line, for
    tests that provoke errors on purpose; ``exit_code``: the one SIGTERM must end it with
    (a test that breaks its drain on purpose).

    ``https``: the server runs with TLS; readiness is polled with this client context.
    ``command_prefix``: run through it, e.g. ``["taskset", "-c", "0"]`` (the benchmark).
    ``upstream_only``: as envoyproxy/ratelimit is run, with no flag and no ``SLUICE_*``
    variable (not even inherited): the ports come from upstream's ``GRPC_HOST``,
    ``GRPC_PORT``, ``HOST`` and ``PORT``, the config database is the default one in
    ``workdir``, and the rest is up to ``env``.
    ``ports``: the gRPC and HTTP ports (a restarted server takes its predecessor's); else
    free ones."""
    grpc_port, http_port = ports if ports is not None else (free_port(), free_port())
    inherited = dict(os.environ)
    if upstream_only:
        assert config is None and database_url is None and not extra_args
        inherited = {k: v for k, v in inherited.items() if not k.startswith("SLUICE_")}
        inherited.update(
            GRPC_HOST="127.0.0.1", GRPC_PORT=str(grpc_port), HOST="127.0.0.1", PORT=str(http_port)
        )
        args = [*command_prefix, sys.executable, "-m", "sluice", "serve"]
    else:
        if database_url is None and not {
            "SLUICE_DATABASE_URL",
            "SLUICE_DATABASE_URL_FILE",
        } & set(env or {}):
            database_url = f"sqlite:///{workdir / 'sluice.db'}"
        args = [
            *command_prefix,
            sys.executable,
            "-m",
            "sluice",
            "serve",
            "--host",
            "127.0.0.1",
            "--grpc-port",
            str(grpc_port),
            "--http-port",
            str(http_port),
            *(["--database-url", database_url] if database_url is not None else []),
            *(["--config", str(Path(config).resolve())] if config is not None else []),
            *extra_args,
        ]
    log_path = workdir / f"sluice-{grpc_port}.log"
    log_file = open(log_path, "w")  # noqa: SIM115 (closed below, after the process)
    # cwd: whatever the server writes beside itself (its snapshot cache) stays in workdir.
    process = subprocess.Popen(
        args,
        stdout=log_file,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=workdir,
        env={**inherited, **(env or {})},
    )
    server = SluiceProcess(process, grpc_port, http_port, log_path, "https" if https else "http")
    try:
        wait_until(
            lambda: process.poll() is not None or _healthy(server.http_url, https),
            30,
            "sluice serve",
        )
        if process.poll() is not None:
            raise RuntimeError(f"sluice serve exited with {process.returncode}:\n{server.log()}")
        yield server
    except BaseException:
        server.terminate()
        log_file.close()
        raise
    code = server.terminate()
    log_file.close()
    check_server_log(server.log(), code, allowed_tracebacks, expected_exit_code=exit_code)


def check_server_log(
    log: str,
    exit_code: int,
    allowed_tracebacks: Sequence[str] = (),
    *,
    expected_exit_code: int = 0,
) -> None:
    """Fail when the server did not exit 0 (or ``expected_exit_code``) or logged a traceback
    no pattern allows."""
    assert exit_code == expected_exit_code, f"sluice serve exited with {exit_code}:\n{log}"
    unexpected = [
        last
        for last in _traceback_ends(log)
        if not any(re.search(pattern, last) for pattern in allowed_tracebacks)
    ]
    assert not unexpected, f"sluice serve logged unexpected tracebacks {unexpected}:\n{log}"


def _traceback_ends(log: str) -> list[str]:
    """The last line of every traceback in ``log`` (the exception and its message), also
    inside the JSON lines of ``LOG_FORMAT=json``."""
    ends = []
    lines = [part for line in log.splitlines() for part in _message_lines(line)]
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            j = i + 1
            while j < len(lines) and (lines[j].startswith(" ") or not lines[j].strip()):
                j += 1
            ends.append(lines[j] if j < len(lines) else "")
    return ends


def _message_lines(line: str) -> list[str]:
    """A JSON log line's ``@message`` split into its lines; any other line as it is."""
    if line.startswith("{"):
        try:
            record = json.loads(line)
        except ValueError:
            return [line]
        if isinstance(record, dict) and isinstance(record.get("@message"), str):
            return record["@message"].splitlines()
    return [line]
