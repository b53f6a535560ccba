"""Credentials reach Sluice from settings or files and never leave it: not in its log (even at
DEBUG, even while the database and Redis fail), not on its HTTP pages, not in ``sluice
settings`` or error messages.

Every secret here is a distinct canary string; the test searches for each one in all that a
server shows to the outside.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.support.processes import SluiceProcess, free_port, run_sluice, sluice_serve

DB_PASSWORD = "db-canary-5b1d"
REDIS_PASSWORD = "redis-canary-0c8a"
API_TOKEN = "token-canary-e42f"
ADMIN_HASH = "scrypt$16384$8$1$hash-canary-77aa$c2FsdA"
SESSION_SECRET = "session-secret-canary-91c3-0123456789abcdef"
OIDC_SECRET = "oidc-canary-3f02"
CANARIES = (DB_PASSWORD, REDIS_PASSWORD, API_TOKEN, ADMIN_HASH, SESSION_SECRET, OIDC_SECRET)
POLICY = """\
domain: d
descriptors:
  - key: k
    rate_limit: {unit: second, requests_per_unit: 1}
"""
DECIDE = json.dumps({"domain": "d", "descriptors": [{"entries": [{"key": "k", "value": "v"}]}]})


def _with_password(url: str, password: str) -> str:
    # PostgreSQL here trusts loopback, so any password connects: the test database works and
    # the canary still travels through every place a real password would.
    return make_url(url).set(password=password).render_as_string(hide_password=False)


def _get(server: SluiceProcess, path: str, token: str | None = None) -> str:
    request = urllib.request.Request(server.http_url + path)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    return _read(request)


def _post(server: SluiceProcess, path: str, body: str) -> str:
    return _read(urllib.request.Request(server.http_url + path, data=body.encode()))


def _read(request: urllib.request.Request) -> str:
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.read().decode()


def _leaks(text: str) -> list[str]:
    return [canary for canary in CANARIES if canary in text]


def test_no_secret_reaches_the_log_or_the_pages(tmp_path: Path, postgres_url: str) -> None:
    # Secrets from files, the way a container gets them. Nothing listens behind the Redis
    # URL, so every decision fails and is logged at DEBUG: the likeliest way to print a URL.
    secrets = {
        "SLUICE_DATABASE_URL_FILE": _with_password(postgres_url, DB_PASSWORD),
        "SLUICE_REDIS_URL_FILE": f"redis://sluice:{REDIS_PASSWORD}@127.0.0.1:{free_port()}/0",
        "SLUICE_API_TOKEN_FILE": API_TOKEN,
        "SLUICE_ADMIN_USERS_FILE": f"ada:editor:{ADMIN_HASH}",
        "SLUICE_ADMIN_SESSION_SECRET_FILE": SESSION_SECRET,
        "SLUICE_ADMIN_OIDC_CLIENT_SECRET_FILE": OIDC_SECRET,
    }
    env = {}
    for name, value in secrets.items():
        (tmp_path / name).write_text(value + "\n")
        env[name] = str(tmp_path / name)
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    args = ["--backend", "redis", "--log-level", "DEBUG", "--redis-failure-mode", "error"]
    with sluice_serve(tmp_path, config=policy, extra_args=args, env=env) as server:
        pages = [_post(server, "/json", DECIDE) for _ in range(3)]
        pages += [_get(server, path) for path in ("/status", "/metrics", "/rlconfig")]
        pages += [_get(server, "/api/v1/domains", token) for token in ("wrong", API_TOKEN)]
        log = server.log()
    assert [d["domain"] for d in json.loads(pages[-1])["domains"]] == ["d"]  # token from file
    assert "Redis" in log  # the failing backend was logged...
    assert _leaks(log) == []  # ...without its password
    assert [page for page in pages if _leaks(page)] == []

    shown = run_sluice(["settings"], env={**os.environ, **env})
    assert shown.returncode == 0 and _leaks(shown.stdout + shown.stderr) == []
    effective = {name: shown["value"] for name, shown in json.loads(shown.stdout).items()}
    assert effective["database_url"] == _with_password(postgres_url, "X").replace(":X@", ":***@")
    assert effective["redis_url"].startswith("redis://sluice:***@")
    assert effective["api_token"] == effective["admin_users"] == "***"
    assert effective["admin_session_secret"] == effective["admin_oidc_client_secret"] == "***"


def test_a_failing_database_is_reported_without_its_password(tmp_path: Path) -> None:
    url = f"postgresql://sluice:{DB_PASSWORD}@127.0.0.1:{free_port()}/sluice"
    result = run_sluice(["export", "--database-url", url, "--domain", "d"])
    assert result.returncode == 3, result.stderr
    assert "config database" in result.stderr and _leaks(result.stderr) == []
