"""The reloader against a config database that accepts connections and never answers (a hung
server, a partition that drops packets): reported down after its timeout, one read at a time,
and the real error reported once the database fails outright."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

from sluice.policies.reloader import SnapshotReloader
from sluice.policies.snapshot import Snapshot
from sluice.policies.store import PolicyStore


class SilentDatabase:
    """Accepts connections and never says a word; ``close()`` hangs up on all of them."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.connections: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.connections.append(self._listener.accept()[0])
            except OSError:
                return  # closed

    def close(self) -> None:
        self._listener.close()
        for connection in self.connections:
            connection.close()


def test_a_database_that_never_answers_is_reported_down_after_the_timeout() -> None:
    silent = SilentDatabase()
    url = f"postgresql://postgres@127.0.0.1:{silent.port}/sluice?connect_timeout=60"
    installed: list[Snapshot] = []

    async def scenario(store: PolicyStore) -> None:
        reloader = SnapshotReloader(
            store,
            installed.append,
            interval_s=60,
            cache_path=None,
            max_log_limit=100,
            timeout_s=0.2,
        )
        reloader.status.database_up = True  # as after a good initial load
        started = time.monotonic()
        assert not await reloader.poll_once()
        assert time.monotonic() - started < 2
        status = reloader.status.as_dict()
        assert (status["database"], status["database_error"]) == (
            "unreachable",
            "config database: no answer within 0.2s",
        )
        for _ in range(3):  # later polls wait for the same read: no pile of stuck threads
            assert not await reloader.poll_once()
        assert len(silent.connections) == 1
        assert reloader.status.database_errors == 4

        silent.close()  # the hung read now fails: the next poll says why
        while reloader.status.database_error.endswith("no answer within 0.2s"):
            assert time.monotonic() - started < 30
            await reloader.poll_once()
        assert "read change token failed" in reloader.status.database_error
        assert installed == []

    try:
        with PolicyStore(url) as store:
            asyncio.run(scenario(store))
    finally:
        silent.close()
