"""A loopback TCP proxy that can hold what clients send: a backend call surely in flight
(its request has left Sluice) for as long as a test needs."""

from __future__ import annotations

import socket
import threading

from tests.support.processes import free_port

__all__ = ["HoldingProxy"]


class HoldingProxy:
    """Forwards 127.0.0.1:port to target. While held, bytes from clients are kept (and
    counted in ``held_bytes``) instead of forwarded; ``release()`` sends them on."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._flowing = threading.Event()
        self._flowing.set()
        self._lock = threading.Lock()
        self.held_bytes = 0
        self._sockets: list[socket.socket] = []
        self._listener = socket.socket()
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(64)
        threading.Thread(target=self._accept, daemon=True).start()

    def hold(self) -> None:
        with self._lock:
            self.held_bytes = 0
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._flowing.set()
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
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pipe, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, False), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while data := source.recv(65536):
                if from_client and not self._flowing.is_set():
                    with self._lock:
                        self.held_bytes += len(data)
                    self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
