"""A private PostgreSQL cluster a test can really stop and start again.

The machine-wide PostgreSQL is shared by every integration test, so a fault test must not stop
it; a TCP proxy (``tests/support/tcp_proxy.py``) only imitates an outage. This runs Debian's
own binaries (``/usr/lib/postgresql/<version>/bin``) on a data directory of the test's own,
listening on a free loopback port and on a socket in that directory.

PostgreSQL refuses to run as root, and tests run as root here and in CI: as root every
command runs as the ``postgres`` user (``runuser``), in a directory under the system's
temporary directory that user owns (pytest's ``tmp_path`` sits under a root-only directory).
Run as any other user, the commands run as that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import psycopg
import pytest

from tests.support.processes import free_port

__all__ = ["PrivatePostgres", "private_postgres"]


def _bin_dir() -> Path:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"), key=_major)
    if not found:
        pytest.fail("PostgreSQL's server binaries are needed: /usr/lib/postgresql/*/bin/pg_ctl")
    return found[-1].parent


def _major(pg_ctl: Path) -> int:
    name = pg_ctl.parent.parent.name
    return int(name) if name.isdigit() else 0


class PrivatePostgres:
    """One PostgreSQL cluster on a fixed port: ``init()``, ``start()``, ``stop()`` (as after a
    crash), ``start()`` again, ``freeze()`` and ``thaw()`` (a hung server), ``remove()``."""

    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.port = free_port()
        self._as_postgres = os.geteuid() == 0
        self.root = Path(tempfile.mkdtemp(prefix="sluice-pg-"))
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            os.chown(self.root, user.pw_uid, user.pw_gid)
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        self._frozen: list[int] = []

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
                  "--no-locale", "--no-sync", "--no-instructions")  # fmt: skip

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """Start and wait until it accepts connections (after crash recovery, if any)."""
        options = " ".join(
            f"-c {setting}"
            for setting in (
                f"port={self.port}",
                "listen_addresses=127.0.0.1",
                f"unix_socket_directories={self.root}",
                "fsync=off",  # the machine does not crash, only PostgreSQL does
                "max_connections=60",
            )
        )
        self._run("pg_ctl", "start", "-D", str(self.data), "-l", str(self.log_path), "-w",
                  "-t", "60", "-o", options)  # fmt: skip

    def stop(self, mode: str = "immediate") -> None:
        """``immediate``: every server process quits at once, without a checkpoint, and
        connections drop mid-transaction, as when PostgreSQL crashes or its host goes away."""
        self._run("pg_ctl", "stop", "-D", str(self.data), "-m", mode, "-w", "-t", "60")

    def freeze(self) -> None:
        """SIGSTOP the postmaster, then every process it forked: connections stay open and
        new ones are accepted by the kernel, but nothing answers, as when the database host
        hangs or a partition swallows packets."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)  # first, so it forks nothing more
        self._frozen = [postmaster]
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and _parent(entry) == postmaster:
                os.kill(int(entry.name), signal.SIGSTOP)
                self._frozen.append(int(entry.name))

    def thaw(self) -> None:
        for pid in self._frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        self._frozen = []

    def running(self) -> bool:
        status = self._run("pg_ctl", "status", "-D", str(self.data), check=False)
        return status.returncode == 0

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True, connect_timeout=5) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def remove(self) -> None:
        self.thaw()
        if self.data.is_dir() and self.running():
            self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def _run(self, program: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv: Sequence[str] = [str(self.bin / program), *args]
        if self._as_postgres:
            argv = ["runuser", "-u", "postgres", "--", *argv]
        # cwd: PostgreSQL's tools refuse to start in a directory their user cannot read.
        result = subprocess.run(
            argv, cwd=self.root, capture_output=True, text=True, timeout=90, check=False
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"{program} {' '.join(args)} failed ({result.returncode}):\n"
                f"{result.stdout}{result.stderr}\n{self.log()}"
            )
        return result


def _parent(proc: Path) -> int | None:
    try:
        # /proc/<pid>/stat: "pid (command) state ppid ..."; the command may contain spaces.
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A started private cluster, stopped and deleted afterwards whatever happened."""
    cluster = None
    try:
        cluster = PrivatePostgres()
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        if cluster is not None:
            cluster.remove()
