"""PemWatcher: what it takes up and what it keeps out, and the log line saying why.
(tests/integration/test_tls_reload.py rotates certificates under a running server.)"""

from __future__ import annotations

import asyncio
import logging
import ssl
from pathlib import Path

import pytest

from sluice.tls_reload import PemBundle, PemWatcher, reload_context
from tests.support.certs import Pki, make_pki


@pytest.fixture(scope="module")
def pkis(tmp_path_factory: pytest.TempPathFactory) -> tuple[Pki, Pki]:
    return make_pki(tmp_path_factory.mktemp("a")), make_pki(tmp_path_factory.mktemp("b"))


def _files(tmp_path: Path, pki: Pki) -> tuple[Path, Path]:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    cert.write_bytes(pki.server_cert.read_bytes())
    key.write_bytes(pki.server_key.read_bytes())
    return cert, key


def test_changes_are_taken_up_once_and_bad_ones_kept_out_with_the_reason(
    tmp_path: Path, pkis: tuple[Pki, Pki], caplog: pytest.LogCaptureFixture
) -> None:
    first, second = pkis
    cert, key = _files(tmp_path, first)
    taken: list[bytes | None] = []
    watcher = PemWatcher(
        "TLS",
        cert_file=str(cert),
        key_file=str(key),
        consumers=[lambda bundle: taken.append(bundle.certificate_chain)],
    )

    async def steps() -> list[bool]:
        seen = [await watcher.check_now()]  # nothing changed since the start
        cert.write_bytes(second.server_cert.read_bytes())  # the key is still the first's
        seen += [await watcher.check_now(), await watcher.check_now()]
        key.write_bytes(second.server_key.read_bytes())
        seen.append(await watcher.check_now())
        cert.unlink()
        seen.append(await watcher.check_now())
        cert.write_text("no PEM here")
        seen.append(await watcher.check_now())
        return seen

    with caplog.at_level(logging.WARNING, "sluice.tls"):
        assert asyncio.run(steps()) == [False, False, False, True, False, False]
    assert taken == [second.server_cert.read_bytes()]
    assert (watcher.reloads, watcher.failures) == (1, 3)  # the mismatch said once, not twice
    reasons = [r.getMessage().split("serves on: ")[1] for r in caplog.records]
    assert "KEY_VALUES_MISMATCH" in reasons[0] or "key values mismatch" in reasons[0]
    assert reasons[1] == f"cannot read {cert}: No such file or directory"
    assert reasons[2] == "the certificate file holds no PEM block"
    assert all(str(cert) in r.getMessage() for r in caplog.records)


def test_reload_context_changes_what_new_handshakes_present(
    tmp_path: Path, pkis: tuple[Pki, Pki]
) -> None:
    first, second = pkis
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(first.server_cert, first.server_key)
    bundle = PemBundle(second.server_cert.read_bytes(), second.server_key.read_bytes(), None)
    reload_context(context, bundle)
    assert _presented(context, second.ca) == ssl.PEM_cert_to_DER_cert(
        second.server_cert.read_text()
    )


def _presented(server: ssl.SSLContext, ca: Path) -> bytes | None:
    """A handshake in memory: the certificate the server context presents."""
    client = ssl.create_default_context(cafile=ca)
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        for side in (c, s):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
    return c.getpeercert(binary_form=True)
