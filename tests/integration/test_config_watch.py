"""`sluice serve --config DIR` follows DIR: two real servers on one PostgreSQL config
database, watching one directory, serve a change within 5 s and publish it once; a broken
change is logged with file and line and the last good version keeps serving."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from sluice.policies.store import PolicyStore
from tests.support.processes import SluiceProcess, sluice_serve, wait_until

WITHIN_S = 5.0  # what the watch promises, file written to decisions changed


def policy(requests_per_unit: int) -> str:
    return (
        "domain: watched\ndescriptors:\n  - key: user\n"
        f"    rate_limit: {{unit: hour, requests_per_unit: {requests_per_unit}}}\n"
    )


def replace(path: Path, text: str) -> None:
    """Write ``path`` whole, as deployment tools do (a new file renamed over the old): a
    look never reads it half-written, so every look sees one of the test's states and the
    error count below is exact. (A file caught half-written is refused:
    tests/integration/test_watcher.py.)"""
    staged = path.with_name(f".{path.name}.new")  # hidden: never read as a policy
    staged.write_text(text)
    staged.replace(path)


def limit_of(server: SluiceProcess) -> int | None:
    """The requests_per_unit the server applies to a fresh user, or None for no limit."""
    body = {
        "domain": "watched",
        "descriptors": [{"entries": [{"key": "user", "value": f"u{time.monotonic_ns()}"}]}],
    }
    request = urllib.request.Request(
        server.http_url + "/json",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        status = json.loads(response.read())["statuses"][0]
    limit = status.get("currentLimit")
    return None if limit is None else int(limit["requestsPerUnit"])


def test_two_servers_watching_one_directory_serve_a_change_and_publish_it_once(
    postgres_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "config"
    config.mkdir()
    (config / "watched.yaml").write_text(policy(10))
    args = ["--config-watch-interval-s", "0.2"]
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    with (
        sluice_serve(
            tmp_path / "one", config=config, database_url=postgres_url, extra_args=args
        ) as one,
        sluice_serve(
            tmp_path / "two", config=config, database_url=postgres_url, extra_args=args
        ) as two,
    ):
        assert limit_of(one) == limit_of(two) == 10

        replace(config / "watched.yaml", policy(20))
        written = time.monotonic()
        wait_until(lambda: limit_of(one) == limit_of(two) == 20, WITHIN_S, "the new limit")
        assert time.monotonic() - written < WITHIN_S

        # Broken: both keep serving 20, and say where the problem is.
        replace(config / "watched.yaml", policy(30) + "    unknown_key: 1\n")
        broken = f"{config / 'watched.yaml'}:5: unknown key 'unknown_key' in a descriptor"
        wait_until(lambda: broken in one.log() and broken in two.log(), WITHIN_S, "the refusal")
        assert limit_of(one) == limit_of(two) == 20

        replace(config / "watched.yaml", policy(40))  # fixed
        wait_until(lambda: limit_of(one) == limit_of(two) == 40, WITHIN_S, "the fixed limit")

        (config / "watched.yaml").unlink()  # removed: no limit any more
        wait_until(lambda: limit_of(one) is None and limit_of(two) is None, WITHIN_S, "removal")
        with urllib.request.urlopen(one.http_url + "/metrics", timeout=5) as response:
            metrics = response.read().decode()
        assert "sluice_config_file_errors_total 1.0" in metrics

    with PolicyStore(postgres_url) as store:
        history = store.history("watched")
    # One version per change, not one per server: 10, 20, 40, deleted.
    assert [(v.version, v.deleted) for v in reversed(history)] == [
        (1, False),
        (2, False),
        (3, False),
        (4, True),
    ]
