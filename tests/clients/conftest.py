"""Fixtures for the client tests: one live ``sluice serve`` for the whole session, a Sluice in
this process whose clock the test moves, and targets where no Sluice answers (nothing
listening; a listener that never speaks).

Tests share the server, so each one checks its own fresh descriptor values (``unique``).
Counting limits are per hour: a fixed window turning over mid-test would reset the counts.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from sluice.app import Sluice
from sluice.clock import ManualClock
from sluice.policies.snapshot import Snapshot
from sluice.policies.yaml_format import load_text
from sluice.settings import Settings
from tests.support.processes import SluiceProcess, free_port, sluice_serve

DOMAIN = "clients"

POLICY = f"""\
domain: {DOMAIN}
descriptors:
  - key: user
    rate_limit: {{name: per-user, unit: hour, requests_per_unit: 3}}
  - key: shaped
    rate_limit:
      name: shaped
      unit: second
      requests_per_unit: 2
      algorithm: leaky_bucket
      burst: 4
  - key: paced
    rate_limit: {{unit: second, requests_per_unit: 5, algorithm: leaky_bucket, burst: 1}}
  - key: blocked
    rate_limit: {{unit: second, requests_per_unit: 0}}
  - key: client
    rate_limit: {{name: per-client, unit: hour, requests_per_unit: 2}}
  - key: job
    rate_limit: {{name: jobs, concurrency: 2, lease_ttl: 3s}}
  - key: grpc_method
    descriptors:
      - key: tenant
        rate_limit: {{name: per-tenant-method, unit: hour, requests_per_unit: 2}}
blocks:
  - {{descriptor: job=blocked}}
"""


@pytest.fixture(scope="session")
def sluice(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SluiceProcess]:
    """``sluice serve`` with the policy above and ``--response-headers``."""
    workdir = tmp_path_factory.mktemp("sluice-clients")
    policy = workdir / "policy.yaml"
    policy.write_text(POLICY)
    with sluice_serve(workdir, config=policy, extra_args=["--response-headers"]) as server:
        yield server


@dataclass(frozen=True)
class SteppedSluice:
    """A real Sluice (gRPC server, limiter, algorithms) whose time is ``clock``: it moves only
    when the test moves it, so the delays it hands out do not depend on how fast the machine
    is."""

    grpc_target: str
    clock: ManualClock


@pytest.fixture(scope="module")
def stepped_sluice() -> Iterator[SteppedSluice]:
    """The same policy served in this process, on its own event loop in a thread, with a
    ManualClock (started at a realistic epoch time)."""
    clock = ManualClock(start=1_700_000_000.0)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="stepped-sluice", daemon=True)
    thread.start()
    settings = Settings(host="127.0.0.1", grpc_port=0, http_port=0, response_headers=True)

    async def start() -> Sluice:
        server = Sluice(settings, clock=clock)
        server.install(Snapshot(load_text(POLICY)))
        await server.start()
        return server

    server = asyncio.run_coroutine_threadsafe(start(), loop).result(timeout=30)
    try:
        yield SteppedSluice(f"127.0.0.1:{server.grpc_port}", clock)
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@pytest.fixture
def unique() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture
def unreachable_target() -> str:
    """A loopback port with nothing listening: connections are refused at once."""
    return f"127.0.0.1:{free_port()}"


@pytest.fixture
def black_hole_target() -> Iterator[str]:
    """A port whose TCP handshakes complete (the kernel's backlog) but that never sends a
    byte: a Sluice that hangs, without mocking anything."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def domain() -> str:
    """The domain of the session server's policy."""
    return DOMAIN
