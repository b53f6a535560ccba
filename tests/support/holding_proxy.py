"""A loopback TCP proxy that can hold what clients send: a backend call surely in flight
(its request has left Sluice) for as long as a test needs, and what a hung backend was sent."""

from __future__ import annotations

import socket
import threading

from tests.support.processes import free_port

__all__ = ["HoldingProxy"]


class HoldingProxy:
    """Forwards 127.0.0.1:port to target. While held, bytes from clients are kept, in order
    (``held_bytes`` counts them, ``held()`` returns them), instead of forwarded: to a client
    the target is hung. ``release()`` sends them on."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self.held_bytes = 0
        self._held: list[bytes] = []  # since the last hold(), whatever became of it
        self._queued: list[tuple[socket.socket, bytes]] = []  # to send on release
        self.connections = 0  # accepted, in all
        self._sockets: list[socket.socket] = []
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        with self._lock:
            self.held_bytes = 0
            self._held = []
            self._flowing.clear()

    def held(self) -> bytes:
        """Every byte clients sent since ``hold()``."""
        with self._lock:
            return b"".join(self._held)

    def release(self) -> None:
        # Under the lock: a client's next bytes wait until those before them are sent.
        with self._lock:
            queued, self._queued = self._queued, []
            for sink, data in queued:
                try:
                    sink.sendall(data)
                except OSError:
                    pass
            self._flowing.set()

    def close(self) -> None:
        self.release()
        for s in [self._listener, *self._sockets]:
            try:
                s.close()
            except OSError:
                pass

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self.connections += 1
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _keep(self, sink: socket.socket, data: bytes) -> bool:
        """While held, keep ``data`` for ``sink`` and say so."""
        with self._lock:
            if self._flowing.is_set():
                return False
            self.held_bytes += len(data)
            self._held.append(data)
            self._queued.append((sink, data))
            return True

    def _pipe(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while data := source.recv(65536):
                if not (from_client and self._keep(sink, data)):
                    sink.sendall(data)
            if from_client:
                self._flowing.wait()  # the client's end, after what it sent while held
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
