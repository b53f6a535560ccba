"""The Redis backend over TLS, as an ACL user, against a redis-server the test configures so:

- only TLS (no plaintext port), and clients must present a certificate the test CA signed;
- the ``default`` user is off; ``sluice`` may touch only keys under its prefix, and may not
  run admin or dangerous commands (FLUSHALL, CONFIG, KEYS, ...).

A real ``sluice serve`` decides through it; wrong credentials give the failure-mode answer
and never show the password in the log.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from sluice.algorithms import ALGORITHMS, Limit
from sluice.app import make_backend
from sluice.backends import Hit
from sluice.backends.redis.backend import RedisBackend
from sluice.backends.redis.connect import RedisTls, SharedSslContext, connect
from sluice.errors import BackendUnavailableError
from sluice.settings import Settings
from sluice.tls_reload import FollowedTls
from tests.support.certs import Pki, make_pki
from tests.support.processes import SluiceProcess, free_port, sluice_serve, wait_until

PASSWORD = "tls-acl-canary-7f3e"
ADMIN_PASSWORD = "admin-canary-91c2"
POLICY = """\
domain: tls
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 2, algorithm: gcra}
  - key: window
    rate_limit: {unit: hour, requests_per_unit: 2}
"""


class TlsRedis:
    def __init__(self, pki: Pki, port: int) -> None:
        self.pki, self.port = pki, port

    def client(self, username: str, password: str, *, with_cert: bool = True) -> redis.Redis:
        certs = (
            {"ssl_certfile": str(self.pki.client_cert), "ssl_keyfile": str(self.pki.client_key)}
            if with_cert
            else {}
        )
        return redis.Redis(
            port=self.port,
            ssl=True,
            ssl_ca_certs=str(self.pki.ca),
            username=username,
            password=password,
            socket_timeout=2,
            **certs,
        )

    def admin(self) -> redis.Redis:
        return self.client("admin", ADMIN_PASSWORD)


def _pings(server: TlsRedis) -> bool:
    try:
        with server.admin() as client:
            return bool(client.ping())
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return False


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[TlsRedis]:
    workdir = tmp_path_factory.mktemp("redis-tls")
    server = TlsRedis(pki, free_port())
    acl = workdir / "users.acl"
    acl.write_text(
        "user default off\n"
        f"user admin on >{ADMIN_PASSWORD} ~* &* +@all\n"
        f"user sluice on >{PASSWORD} ~sluice:* resetchannels +@all -@admin -@dangerous\n"
    )
    argv = [
        shutil.which("redis-server") or "/usr/bin/redis-server",
        "--port", "0",
        "--tls-port", str(server.port),
        "--bind", "127.0.0.1",
        "--tls-cert-file", str(pki.server_cert),
        "--tls-key-file", str(pki.server_key),
        "--tls-ca-cert-file", str(pki.ca),
        "--tls-auth-clients", "yes",
        "--save", "", "--appendonly", "no", "--dir", str(workdir),
        "--aclfile", str(acl),
    ]  # fmt: skip
    log = (workdir / "redis.log").open("w")
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: process.poll() is not None or _pings(server), 10, "TLS redis-server")
        if process.poll() is not None:
            pytest.fail(f"redis-server exited: {(workdir / 'redis.log').read_text()}")
        yield server
    finally:
        process.kill()
        process.wait(10)
        log.close()


def _serve(
    workdir: Path, server: TlsRedis, url: str, *, client_cert: bool = True
) -> Iterator[SluiceProcess]:
    policy = workdir / "policy.yaml"
    policy.write_text(POLICY)
    files = ["--redis-tls-ca-file", str(server.pki.ca)]
    if client_cert:
        files += [
            "--redis-tls-cert-file",
            str(server.pki.client_cert),
            "--redis-tls-key-file",
            str(server.pki.client_key),
        ]
    args = ["--backend", "redis", "--redis-url", url, "--redis-failure-mode", "deny", *files]
    # DEBUG: the test asserts that not even debug logging shows the password.
    with sluice_serve(workdir, config=policy, extra_args=[*args, "--log-level", "DEBUG"]) as s:
        yield s


def _ask(server: SluiceProcess, key: str, value: str) -> dict:
    body = json.dumps(
        {"domain": "tls", "descriptors": [{"entries": [{"key": key, "value": value}]}]}
    )
    request = urllib.request.Request(server.http_url + "/json", data=body.encode())
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return json.loads(exc.read())


def test_decisions_through_redis_over_tls_as_an_acl_user(
    tmp_path: Path, tls_redis: TlsRedis
) -> None:
    url = f"rediss://sluice:{PASSWORD}@127.0.0.1:{tls_redis.port}/0"
    for s in _serve(tmp_path, tls_redis, url):
        codes = {
            key: [_ask(s, key, "ada")["overallCode"] for _ in range(3)]
            for key in ("user", "window")
        }
        log = s.log()
    assert codes == {key: ["OK", "OK", "OVER_LIMIT"] for key in ("user", "window")}
    with tls_redis.admin() as admin:
        keys = [k.decode() for k in admin.scan_iter(count=1000)]
        assert keys and all(k.startswith("sluice:") for k in keys)
        assert all(admin.ttl(k) > 0 for k in keys)
        admin.flushall()
    assert PASSWORD not in log


@pytest.mark.parametrize(
    ("case", "password", "client_cert"),
    [("wrong password", "not-the-password", True), ("no client certificate", PASSWORD, False)],
)
def test_refused_connections_get_the_failure_mode_answer_and_hide_the_password(
    tmp_path: Path, tls_redis: TlsRedis, case: str, password: str, client_cert: bool
) -> None:
    url = f"rediss://sluice:{password}@127.0.0.1:{tls_redis.port}/0"
    for s in _serve(tmp_path, tls_redis, url, client_cert=client_cert):
        answers = [_ask(s, "user", "bob")["overallCode"] for _ in range(3)]
        log = s.log()
    assert answers == ["OVER_LIMIT"] * 3  # --redis-failure-mode deny
    assert "Redis" in log and password not in log


@pytest.mark.slow
def test_the_acl_user_cannot_leave_its_prefix_or_run_admin_commands(tls_redis: TlsRedis) -> None:
    # What the ACL in this test (and docs/security.md) grants: a stolen Sluice password
    # reaches Sluice's own counters and nothing else.
    with tls_redis.client("sluice", PASSWORD) as client:
        client.set("sluice:probe", "1", ex=10)
        for command in (("GET", "other:key"), ("FLUSHALL",), ("CONFIG", "GET", "*"), ("KEYS", "*")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
    with pytest.raises(redis.exceptions.ConnectionError):
        with tls_redis.client("sluice", PASSWORD, with_cert=False) as client:
            client.ping()


def test_the_lean_client_path_speaks_tls_and_authenticates(tls_redis: TlsRedis) -> None:
    # `sluice serve` above decides through the backend's lean path (wire.ScriptConnection);
    # this pins that it is the lean path, with the TLS files and the ACL user of the URL.
    pki = tls_redis.pki
    url = f"rediss://sluice:{PASSWORD}@127.0.0.1:{tls_redis.port}/0"
    hit = Hit(("tls", "lean"), (Limit(2, 3600, ALGORITHMS["gcra"], 2),), 1)

    async def decide(tls: RedisTls) -> list[bool]:
        backend = RedisBackend(connect(url, timeout_s=2, tls=tls), key_prefix="sluice:lean:")
        assert backend.lean_connection is not None
        try:
            return [(await backend.apply([hit], time.time()))[0][0].allowed for _ in range(3)]
        finally:
            await backend.close()

    with_cert = RedisTls(str(pki.ca), str(pki.client_cert), str(pki.client_key))
    assert asyncio.run(decide(with_cert)) == [True, True, False]
    with pytest.raises(BackendUnavailableError, match="ConnectionError"):
        asyncio.run(decide(RedisTls(str(pki.ca))))
    with tls_redis.admin() as admin:
        admin.flushall()


def test_a_rotated_client_certificate_reaches_new_connections_only(
    tmp_path: Path, tls_redis: TlsRedis
) -> None:
    # The wiring `sluice serve` uses (FollowedTls over the client's SharedSslContext): the
    # connection the backend holds goes on; a new handshake presents the new certificate,
    # which Redis refuses here when it is the rogue CA's and accepts when it is ours again;
    # a file that is no certificate changes nothing.
    pki = tls_redis.pki
    cert, key = tmp_path / "client.crt", tmp_path / "client.key"
    cert.write_bytes(pki.client_cert.read_bytes())
    key.write_bytes(pki.client_key.read_bytes())
    url = f"rediss://sluice:{PASSWORD}@127.0.0.1:{tls_redis.port}/0"
    settings = Settings(
        backend="redis",
        redis_url=url,
        redis_tls_ca_file=str(pki.ca),
        redis_tls_cert_file=str(cert),
        redis_tls_key_file=str(key),
    )
    hit = Hit(("tls", "rotation"), (Limit(100, 3600, ALGORITHMS["gcra"], 100),), 1)

    async def handshake_accepted(shared: SharedSslContext) -> bool:
        # Redis checks the client certificate in the handshake (TLS 1.3: it says so on the
        # first read), so a PING tells.
        assert shared.context is not None
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", tls_redis.port, ssl=shared.context, server_hostname="127.0.0.1"
        )
        try:
            writer.write(b"PING\r\n")
            return await reader.read(100) != b""
        except (OSError, ssl.SSLError):
            return False
        finally:
            writer.close()

    async def rotate() -> list[object]:
        shared = SharedSslContext()
        backend = make_backend(settings, redis_ssl_context=shared)
        followed = FollowedTls(None, shared, settings)
        assert followed.redis is not None
        seen: list[object] = []
        try:
            seen.append((await backend.apply([hit], time.time()))[0][0].allowed)
            seen.append(await handshake_accepted(shared))
            cert.write_bytes(pki.rogue_cert.read_bytes())
            key.write_bytes(pki.rogue_key.read_bytes())
            seen.append(await followed.redis.check_now())
            seen.append(await handshake_accepted(shared))  # Redis refuses the rogue one
            seen.append((await backend.apply([hit], time.time()))[0][0].allowed)  # held
            cert.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
            seen.append(await followed.redis.check_now())
            seen.append(followed.redis.failures)
            cert.write_bytes(pki.client_cert.read_bytes())
            key.write_bytes(pki.client_key.read_bytes())
            seen.append(await followed.redis.check_now())
            seen.append(await handshake_accepted(shared))
        finally:
            await backend.close()
        return seen

    assert asyncio.run(rotate()) == [True, True, True, False, True, False, 1, True, True]
    with tls_redis.admin() as admin:
        admin.flushall()
