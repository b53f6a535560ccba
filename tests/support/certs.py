"""Certificates made at test time: a CA, a server certificate for loopback, client
certificates, and a second CA whose certificates the server must not trust."""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signed the server's and the trusted client's certificates
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_cert: Path  # a client certificate from a CA nobody trusts
    rogue_key: Path

    def client_context(self, *, with_cert: bool = True, rogue: bool = False) -> ssl.SSLContext:
        """An HTTPS client context that trusts the CA and presents a certificate if asked."""
        context = ssl.create_default_context(cafile=self.ca)
        if rogue:
            context.load_cert_chain(self.rogue_cert, self.rogue_key)
        elif with_cert:
            context.load_cert_chain(self.client_cert, self.client_key)
        return context


def make_pki(directory: Path) -> Pki:
    ca, rogue_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client.sluice.test")
    rogue = rogue_ca.issue_cert("client.sluice.test")
    pki = Pki(*(directory / name for name in _NAMES))
    ca.cert_pem.write_to_path(pki.ca)
    server.cert_chain_pems[0].write_to_path(pki.server_cert)
    server.private_key_pem.write_to_path(pki.server_key)
    client.cert_chain_pems[0].write_to_path(pki.client_cert)
    client.private_key_pem.write_to_path(pki.client_key)
    rogue.cert_chain_pems[0].write_to_path(pki.rogue_cert)
    rogue.private_key_pem.write_to_path(pki.rogue_key)
    return pki


_NAMES = (
    "ca.pem",
    "server.pem",
    "server.key",
    "client.pem",
    "client.key",
    "rogue.pem",
    "rogue.key",
)
