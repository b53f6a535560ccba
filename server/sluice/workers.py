"""``sluice serve --workers N``: a supervisor and N worker processes sharing both ports.

One Python process uses one core. With N > 1, ``sluice serve`` imports ``--config`` and
upgrades the config database once (cli.py), then becomes this supervisor: it serves nothing
itself, starts N workers (``python -m sluice.workers``), each a whole Sluice listening on the
same gRPC and HTTP ports with SO_REUSEPORT (the kernel spreads connections across them),
and:

- restarts a worker that exits, at once if it had been serving for a while, else after a
  back-off that doubles (0.5 s up to 30 s) while it keeps failing;
- exits with a failing worker's exit code (1 setting or policy, 3 config database) when no
  worker has managed to start at all;
- on SIGTERM or SIGINT, forwards the signal to every worker, which drains as a single
  server does (``Sluice.run_until_signal``), waits for them and exits 0.

With ``--transport pyvoy`` a worker is the launcher of one Envoy with Sluice inside it
(sluice/pyvoy_launcher.py), whose listener shares the gRPC port with SO_REUSEPORT as well:
the launcher exits when its Envoy dies, so the supervisor replaces the pair, and drains it on
SIGTERM as a single ``--transport pyvoy`` server does.

Workers get their settings on stdin (never in argv or the environment, where secrets would
show), tell the supervisor they serve by writing to a pipe, and share a private metrics
directory (``PROMETHEUS_MULTIPROC_DIR``) that the supervisor removes at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from types import FrameType

from sluice.logs import configure as configure_logging
from sluice.settings import Settings, flag_name

__all__ = ["Supervisor", "refusal", "worker_main"]

log = logging.getLogger("sluice.workers")

_READY = b"r"
_SERVED_LONG_ENOUGH_S = 10.0  # a worker that ends sooner is failing to start: back off
_BACKOFF_FIRST_S = 0.5
_BACKOFF_MAX_S = 30.0
# Beyond --drain-delay-s and --shutdown-grace-s, what a draining worker may still take: the
# last usage flush (at most 5 s) and closing; then the supervisor kills what is left.
_DRAIN_MARGIN_S = 15.0


def refusal(settings: Settings) -> str | None:
    """Why these settings cannot run as several workers, or None."""
    n = settings.worker_count
    if settings.backend == "memory":
        return (
            f"{flag_name('workers')} {n} needs {flag_name('backend')} redis: with the memory "
            "backend each worker would keep its own counters and limits would not hold; "
            f"use Redis, or {flag_name('workers')} 1"
        )
    for name in ("grpc_port", "http_port"):
        if getattr(settings, name) == 0:
            return (
                f"{flag_name(name)} 0 (any free port) cannot be shared by "
                f"{flag_name('workers')} {n}: give a port number"
            )
    return None


@dataclass(eq=False)
class _Worker:
    index: int
    process: subprocess.Popen[bytes] | None = None
    ready_fd: int | None = None  # read end of the pipe the worker says it serves on
    started_at: float = 0.0
    ready: bool = False
    quick_exits: int = 0  # consecutive exits before serving long enough
    restart_at: float | None = None

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None


class Supervisor:
    def __init__(self, settings: Settings, count: int) -> None:
        self.settings = settings
        self.workers = [_Worker(i) for i in range(1, count + 1)]
        self._metrics_dir = ""
        self._signal: int | None = None
        self._stopping = False
        self._stop_deadline = 0.0
        self._any_ready = False
        self._exit_code = 0

    def run(self) -> int:
        """Start the workers and supervise them until a signal; the exit code."""
        self._metrics_dir = tempfile.mkdtemp(prefix="sluice-metrics-")
        wake_r, wake_w = socket.socketpair()
        for end in (wake_r, wake_w):
            end.setblocking(False)
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)
        }
        previous[signal.SIGCHLD] = signal.signal(signal.SIGCHLD, lambda *_: None)
        old_wakeup = signal.set_wakeup_fd(wake_w.fileno())
        try:
            s = self.settings
            log.info(
                "supervisor (pid %d): %d workers on gRPC %s:%d and HTTP %s:%d",
                os.getpid(),
                len(self.workers),
                s.host,
                s.grpc_port,
                s.host,
                s.http_port,
            )
            for worker in self.workers:
                self._start(worker)
            return self._supervise(wake_r)
        finally:
            signal.set_wakeup_fd(old_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            wake_r.close()
            wake_w.close()
            for worker in self.workers:
                self._close_ready_fd(worker)
            shutil.rmtree(self._metrics_dir, ignore_errors=True)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self._signal = signum  # acted on by the loop, which the wakeup fd wakes

    def _supervise(self, wake: socket.socket) -> int:
        while True:
            if self._signal is not None:
                self._stop(self._signal)
                self._signal = None
            self._reap()
            if self._stopping and not any(w.alive for w in self.workers):
                log.info("all workers stopped")
                return self._exit_code
            now = time.monotonic()
            if self._stopping and now >= self._stop_deadline:
                for worker in self.workers:
                    if worker.alive:
                        assert worker.process is not None
                        log.error("worker %d (pid %d) still running: killed", *_who(worker))
                        worker.process.kill()
                        worker.process.wait()
                return 1
            for worker in self.workers:
                if (
                    not self._stopping
                    and worker.restart_at is not None
                    and now >= worker.restart_at
                ):
                    self._start(worker)
            waiting = [w.ready_fd for w in self.workers if w.ready_fd is not None]
            readable, _, _ = select.select([wake.fileno(), *waiting], [], [], self._timeout())
            with contextlib.suppress(BlockingIOError):
                while wake.recv(512):
                    pass
            for worker in self.workers:
                if worker.ready_fd in readable:
                    self._read_ready(worker)

    def _timeout(self) -> float:
        now = time.monotonic()
        if self._stopping:
            return max(0.0, self._stop_deadline - now)
        due = [w.restart_at for w in self.workers if w.restart_at is not None]
        # A short poll besides SIGCHLD: a signal that lands between the checks and select
        # is not missed for long.
        return max(0.0, min([*due, now + 1.0]) - now)

    def _start(self, worker: _Worker) -> None:
        ready_r, ready_w = os.pipe()
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": self._metrics_dir}
        process = subprocess.Popen(
            [sys.executable, "-m", "sluice.workers", str(worker.index), str(ready_w)],
            stdin=subprocess.PIPE,
            pass_fds=(ready_w,),
            env=env,
        )
        os.close(ready_w)
        assert process.stdin is not None
        try:
            # The count, resolved: each worker shares the ports (see Sluice.start).
            settings = dataclasses.replace(self.settings, workers=str(len(self.workers)))
            process.stdin.write(json.dumps(dataclasses.asdict(settings)).encode())
            process.stdin.close()
        except BrokenPipeError:
            pass  # it died already: reaped as any exit
        worker.process, worker.ready_fd = process, ready_r
        worker.started_at, worker.ready, worker.restart_at = time.monotonic(), False, None
        log.info("worker %d starting (pid %d)", worker.index, process.pid)

    def _read_ready(self, worker: _Worker) -> None:
        assert worker.ready_fd is not None
        try:
            data = os.read(worker.ready_fd, 1)
        except BlockingIOError:
            return
        if data == _READY and not worker.ready:
            worker.ready = self._any_ready = True
            log.info("worker %d ready (pid %d)", *_who(worker))
        self._close_ready_fd(worker)

    def _close_ready_fd(self, worker: _Worker) -> None:
        if worker.ready_fd is not None:
            os.close(worker.ready_fd)
            worker.ready_fd = None

    def _reap(self) -> None:
        for worker in self.workers:
            if worker.process is None or worker.process.returncode is not None:
                continue
            code = worker.process.poll()
            if code is None:
                continue
            if worker.ready_fd is not None:
                os.set_blocking(worker.ready_fd, False)
                self._read_ready(worker)  # it may have said so just before it ended
            self._exited(worker, code)

    def _exited(self, worker: _Worker, code: int) -> None:
        from prometheus_client.multiprocess import mark_process_dead

        assert worker.process is not None
        pid = worker.process.pid
        # Its live gauges stop counting.
        mark_process_dead(pid, self._metrics_dir)  # type: ignore[no-untyped-call]
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
        if self._stopping:
            clean = code == 0 or (not worker.ready and -code in (signal.SIGTERM, signal.SIGINT))
            if not clean and self._exit_code == 0:  # keep the code of a failed start
                self._exit_code = 1
            log.log(
                logging.INFO if clean else logging.ERROR,
                "worker %d (pid %d) %s",
                *_who(worker),
                how,
            )
            return
        if not worker.ready and not self._any_ready:
            # Nothing has ever started: the settings, the policies or the database are wrong,
            # and every worker would fail the same way. Give up with the worker's exit code.
            log.error("worker %d (pid %d) %s before serving: stopping", worker.index, pid, how)
            self._exit_code = code if code > 0 else 1
            self._stop(signal.SIGTERM)
            return
        if not worker.ready or time.monotonic() - worker.started_at < _SERVED_LONG_ENOUGH_S:
            worker.quick_exits += 1
            delay = min(_BACKOFF_FIRST_S * 2 ** (worker.quick_exits - 1), _BACKOFF_MAX_S)
        else:
            worker.quick_exits = 0
            delay = 0.0
        worker.restart_at = time.monotonic() + delay
        log.warning("worker %d (pid %d) %s; restarting it in %.1fs", worker.index, pid, how, delay)

    def _stop(self, signum: int) -> None:
        if not self._stopping:
            self._stopping = True
            self._stop_deadline = (
                time.monotonic()
                + self.settings.drain_delay_s
                + self.settings.shutdown_grace_s
                + _DRAIN_MARGIN_S
            )
            log.info("%s: stopping %d workers", signal.Signals(signum).name, len(self.workers))
        for worker in self.workers:
            worker.restart_at = None
            if worker.alive:
                assert worker.process is not None
                with contextlib.suppress(ProcessLookupError):
                    worker.process.send_signal(signum)


def _who(worker: _Worker) -> tuple[int, int]:
    assert worker.process is not None
    return worker.index, worker.process.pid


# -- the worker process ---------------------------------------------------------------------


def worker_main(argv: list[str]) -> int:
    """One worker: settings from stdin, serve until SIGTERM like ``sluice serve`` does."""
    from sluice.exit_codes import run_reporting_errors

    index, ready_fd = int(argv[0]), int(argv[1])
    settings = Settings(**json.loads(sys.stdin.buffer.read()))
    configure_logging(level=settings.log_level, log_format=settings.log_format, worker=index)
    _end_with_parent()

    def started() -> None:
        os.write(ready_fd, _READY)
        os.close(ready_fd)

    def serve() -> int:
        if settings.transport == "pyvoy":
            # Envoy (with Sluice inside) serves; this process drives it, as `sluice serve`
            # does with one worker, and ends with it.
            from sluice.pyvoy_launcher import serve as serve_with_envoy

            return asyncio.run(serve_with_envoy(settings, started=started, worker=index))

        from sluice.app import Sluice
        from sluice.policies.store import PolicyStore

        sluice = Sluice(settings, metrics_dir=os.environ["PROMETHEUS_MULTIPROC_DIR"])
        with PolicyStore(settings.database_url) as store:
            sluice.attach(store)
            asyncio.run(sluice.run_until_signal(started))
        return 0

    return run_reporting_errors(serve)


def _end_with_parent() -> None:
    """Have the kernel send SIGTERM (drain, as the supervisor would) if the supervisor dies
    without stopping this worker, so no orphan keeps serving the ports. Linux only."""
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(worker_main(sys.argv[1:]))
