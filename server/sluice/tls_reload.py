"""Certificates followed while serving: a changed certificate, key or CA file is checked and,
if good, used for every new TLS handshake, without closing a connection.

``PemWatcher`` hashes the files it follows on a thread every ``interval_s`` (a Kubernetes
Secret volume swaps them all at once behind its ``..data`` symlink; cert-manager and an
operator's ``mv`` replace them one by one, so a key may briefly not match its certificate:
that is an invalid state, kept out like any other until the pair matches again). A change is
read once into memory, loaded into a scratch ``ssl.SSLContext`` to prove that the key matches
the certificate and the CA file holds a CA, and only then handed to the consumers, from the
very bytes that were checked (``PemBundle.paths``: in-memory files, never a copy on disk). A
bad change is logged with the reason, once per content, and the previous certificate keeps
serving; the next good content is taken up as usual.

Consumers: the HTTP port's ``ssl.SSLContext`` (``load_cert_chain`` again: new handshakes get
the new certificate, established connections keep theirs), grpc.aio's certificate fetcher
(``GrpcCertificates``), the Redis client's shared context (``sluice.backends.redis.connect``).
Under pyvoy, Envoy follows the gRPC port's files itself through file-based SDS
(``sluice.pyvoy_launcher``); the app inside it runs this watcher for the HTTP port.

A CA file's change adds its CAs to those the HTTP port and the Redis client trust: Python's
``ssl`` cannot forget a CA, so a CA removed from the file is still trusted there until a
restart (grpc.aio and Envoy take the new file as the whole trust).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import os
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc

from sluice.backends.redis.connect import SharedSslContext
from sluice.periodic import Periodic
from sluice.settings import Settings
from sluice.tls import ServerTls

__all__ = ["FollowedTls", "GrpcCertificates", "PemBundle", "PemWatcher", "reload_context"]

log = logging.getLogger("sluice.tls")


@dataclass(frozen=True)
class PemBundle:
    """One content of the followed files: a certificate chain and its key, and a CA bundle
    (None when none is followed)."""

    certificate_chain: bytes | None
    private_key: bytes | None
    ca: bytes | None

    @contextlib.contextmanager
    def paths(self) -> Iterator[tuple[str | None, str | None]]:
        """The chain and the key as file names OpenSSL can open (``load_cert_chain`` reads
        only files): anonymous in-memory files (memfd), so the key never touches a disk."""
        fds: list[int] = []
        try:
            names: list[str | None] = []
            for data in (self.certificate_chain, self.private_key):
                if data is None:
                    names.append(None)
                    continue
                fd = os.memfd_create("sluice-pem", os.MFD_CLOEXEC)
                fds.append(fd)
                os.write(fd, data)
                names.append(f"/proc/self/fd/{fd}")
            yield names[0], names[1]
        finally:
            for fd in fds:
                os.close(fd)

    def check(self) -> None:
        """Raise ``ValueError`` saying why this is not a usable certificate, key and CA."""
        for name, data in (
            ("certificate", self.certificate_chain),
            ("key", self.private_key),
            ("CA", self.ca),
        ):
            if data is not None and b"-----BEGIN " not in data:
                raise ValueError(f"the {name} file holds no PEM block")
        reload_context(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), self)


def reload_context(context: ssl.SSLContext, bundle: PemBundle) -> None:
    """Load ``bundle`` into ``context``: its new handshakes use it, its connections keep
    theirs. ``ValueError`` saying why, when the bundle is not usable."""
    try:
        if bundle.certificate_chain is not None:
            with bundle.paths() as (chain, key):
                assert chain is not None  # a chain always comes with its key
                context.load_cert_chain(chain, key)
        if bundle.ca is not None:
            context.load_verify_locations(cadata=bundle.ca.decode("ascii", "replace"))
    except ssl.SSLError as exc:
        raise ValueError(str(exc.reason or exc)) from None


class PemWatcher:
    """Follows PEM files and hands each good new content to ``consumers`` (module docstring).

    ``label`` names what the files serve in the log lines (``TLS``, ``Redis TLS``)."""

    def __init__(
        self,
        label: str,
        *,
        cert_file: str = "",
        key_file: str = "",
        ca_file: str = "",
        interval_s: float = 1.0,
        consumers: list[Callable[[PemBundle], None]] | None = None,
    ) -> None:
        self.label = label
        self._cert_file = cert_file
        self._key_file = key_file
        self._ca_file = ca_file
        self.consumers = list(consumers or [])
        self.reloads = 0  # good changes taken up
        self.failures = 0  # bad changes kept out (each content counted once)
        self._seen = self._digest(self._read())  # what the server started with
        self._rejected: bytes | None = None
        self._periodic = Periodic(f"{label} certificate watch", interval_s, self.check_now)

    @property
    def following(self) -> bool:
        return bool(self._cert_file or self._ca_file)

    def start(self) -> None:
        self._periodic.start()

    async def stop(self) -> None:
        await self._periodic.stop()

    async def check_now(self) -> bool:
        """Look at the files once; True when a new content was taken up."""
        try:
            bundle = await asyncio.to_thread(self._read)
        except OSError as exc:
            reason = f"cannot read {exc.filename}: {exc.strerror}"
            self._reject(reason.encode(), reason)
            return False
        digest = self._digest(bundle)
        if digest == self._seen:
            self._rejected = None
            return False
        try:
            bundle.check()
        except ValueError as exc:
            self._reject(digest, str(exc))
            return False
        for consume in self.consumers:
            consume(bundle)
        self._seen = digest
        self._rejected = None
        self.reloads += 1
        log.info("%s: new certificate files taken up (%s)", self.label, self._names())
        return True

    def _reject(self, digest: bytes, reason: str) -> None:
        if digest == self._rejected:
            return  # said once per content, not every interval
        self._rejected = digest
        self.failures += 1
        log.warning(
            "%s: the changed files (%s) are not used, the previous certificate serves on: %s",
            self.label,
            self._names(),
            reason,
        )

    def _names(self) -> str:
        return ", ".join(name for name in (self._cert_file, self._key_file, self._ca_file) if name)

    def _read(self) -> PemBundle:
        def read(name: str) -> bytes | None:
            return Path(name).read_bytes() if name else None

        return PemBundle(read(self._cert_file), read(self._key_file), read(self._ca_file))

    @staticmethod
    def _digest(bundle: PemBundle) -> bytes:
        h = hashlib.sha256()
        for part in (bundle.certificate_chain, bundle.private_key, bundle.ca):
            h.update(b"-" if part is None else b"+%d:" % len(part) + part)
        return h.digest()


class GrpcCertificates:
    """grpc.aio's server credentials, following the watcher: grpc asks ``_fetch`` before each
    new handshake (on its own threads), which hands over a new configuration once."""

    def __init__(self, bundle: PemBundle, *, require_client_auth: bool) -> None:
        self._lock = threading.Lock()
        self._pending: grpc.ServerCertificateConfiguration | None = None
        self.credentials = grpc.dynamic_ssl_server_credentials(
            self._configuration(bundle),
            self._fetch,  # type: ignore[arg-type]  # grpc-stubs omit the None grpc documents
            require_client_authentication=require_client_auth,
        )

    def consume(self, bundle: PemBundle) -> None:
        configuration = self._configuration(bundle)
        with self._lock:
            self._pending = configuration

    def _fetch(self) -> grpc.ServerCertificateConfiguration | None:
        with self._lock:
            configuration, self._pending = self._pending, None
        return configuration

    def _configuration(self, bundle: PemBundle) -> grpc.ServerCertificateConfiguration:
        assert bundle.certificate_chain is not None and bundle.private_key is not None
        return grpc.ssl_server_certificate_configuration(
            [(bundle.private_key, bundle.certificate_chain)], root_certificates=bundle.ca
        )


class FollowedTls:
    """The TLS material app.py wires, each followed while serving when the settings' watch
    interval is above 0: the service ports' certificate, key and client CA
    (``grpc_credentials`` for grpc.aio, ``http_context`` for the HTTP port), and the Redis
    client's certificate, key and CA (loaded into ``redis_ssl_context``)."""

    def __init__(
        self, tls: ServerTls | None, redis_ssl_context: SharedSslContext, settings: Settings
    ) -> None:
        interval_s = settings.tls_watch_interval_s
        self._tls = tls
        self.server: PemWatcher | None = None
        self.redis: PemWatcher | None = None
        if tls is not None and interval_s > 0:
            self.server = PemWatcher(
                "TLS",
                cert_file=settings.tls_cert_file,
                key_file=settings.tls_key_file,
                ca_file=settings.tls_client_ca_file,
                interval_s=interval_s,
            )
        redis_tls = settings.redis_tls_cert_file or settings.redis_tls_ca_file
        if (
            interval_s > 0
            and settings.backend == "redis"
            and settings.redis_url.startswith("rediss")
            and redis_tls
        ):

            def reload_redis(bundle: PemBundle) -> None:
                # None: no connection yet; the first one reads the files as they are then.
                if redis_ssl_context.context is not None:
                    reload_context(redis_ssl_context.context, bundle)

            self.redis = PemWatcher(
                "Redis TLS",
                cert_file=settings.redis_tls_cert_file,
                key_file=settings.redis_tls_key_file,
                ca_file=settings.redis_tls_ca_file,
                interval_s=interval_s,
                consumers=[reload_redis],
            )

    def grpc_credentials(self) -> grpc.ServerCredentials | None:
        """grpc.aio's credentials; None for plaintext."""
        if self._tls is None:
            return None
        if self.server is None:
            return self._tls.grpc_credentials()
        certificates = GrpcCertificates(
            PemBundle(self._tls.certificate_chain, self._tls.private_key, self._tls.client_ca),
            require_client_auth=self._tls.mutual,
        )
        self.server.consumers.append(certificates.consume)
        return certificates.credentials

    def http_context(self) -> ssl.SSLContext | None:
        """The HTTP port's context; None for plaintext."""
        if self._tls is None:
            return None
        context = self._tls.http_context()
        if self.server is not None:
            self.server.consumers.append(functools.partial(reload_context, context))
        return context

    @property
    def reloads(self) -> int:
        return sum(w.reloads for w in (self.server, self.redis) if w is not None)

    @property
    def failures(self) -> int:
        return sum(w.failures for w in (self.server, self.redis) if w is not None)

    def start(self) -> None:
        for watcher in (self.server, self.redis):
            if watcher is not None:
                watcher.start()

    async def stop(self) -> None:
        for watcher in (self.server, self.redis):
            if watcher is not None:
                await watcher.stop()
