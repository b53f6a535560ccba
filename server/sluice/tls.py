"""TLS for both ports, from PEM files named by the settings.

One certificate serves the gRPC and the HTTP port, so a client sees the same identity on
either. With a client CA set, both ports demand a client certificate that CA signed (mTLS):
the TLS handshake fails before any request is read, so an unauthenticated caller never
reaches the limiter, the write API or the metrics.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

from sluice.errors import SluiceError
from sluice.settings import Settings, flag_name

__all__ = ["ServerTls"]


@dataclass(frozen=True)
class ServerTls:
    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None
    cert_file: Path
    key_file: Path
    client_ca_file: Path | None

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerTls | None:
        """The files read and checked now, so a bad path stops the start with its flag named;
        None when TLS is off."""
        if not settings.tls_cert_file:
            return None
        ca_file = settings.tls_client_ca_file
        tls = cls(
            certificate_chain=_read("tls_cert_file", settings.tls_cert_file),
            private_key=_read("tls_key_file", settings.tls_key_file),
            client_ca=_read("tls_client_ca_file", ca_file) if ca_file else None,
            cert_file=Path(settings.tls_cert_file),
            key_file=Path(settings.tls_key_file),
            client_ca_file=Path(ca_file) if ca_file else None,
        )
        tls.http_context()  # a key that does not match its certificate fails here, by name
        return tls

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None

    def grpc_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.private_key, self.certificate_chain)],
            root_certificates=self.client_ca,
            require_client_auth=self.mutual,
        )

    def http_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except ssl.SSLError as exc:
            raise SluiceError(
                f"{flag_name('tls_cert_file')}/{flag_name('tls_key_file')}: "
                f"not a certificate and its matching key ({exc.reason or exc})"
            ) from None
        if self.client_ca_file is not None:
            try:
                context.load_verify_locations(cafile=self.client_ca_file)
            except ssl.SSLError as exc:
                raise SluiceError(
                    f"{flag_name('tls_client_ca_file')}: no CA certificate in "
                    f"{self.client_ca_file} ({exc.reason or exc})"
                ) from None
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def _read(name: str, path: str) -> bytes:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SluiceError(f"{flag_name(name)}: cannot read {path}: {exc.strerror}") from None
    if b"-----BEGIN " not in data:
        raise SluiceError(f"{flag_name(name)}: {path} holds no PEM block")
    return data
