"""The README's two commands are the ones CI and users run; its endpoints are the served ones."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).parents[2]


def sh_blocks() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.S)


def test_ci_runs_the_readme_test_command() -> None:
    test_command = sh_blocks()[2].strip()
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text().splitlines()


def test_quickstart_serves_an_example_policy_that_exists() -> None:
    start = sh_blocks()[0].strip()
    assert "sluice serve --config examples/ratelimit.yaml" in start
    assert (ROOT / "examples" / "ratelimit.yaml").is_file()


def test_every_http_endpoint_is_listed_and_served() -> None:
    readme = (ROOT / "README.md").read_text()
    routes = "".join(
        (ROOT / "server" / "sluice" / "http" / name).read_text()
        for name in ("app.py", "management.py", "api.py")
    )
    for path in ("/json", "/healthcheck", "/ready", "/metrics", "/rlconfig", "/status", "/api/v1"):
        assert f"`{path}" in readme, path
        assert f'"{path}' in routes, path
    assert "Without policies Sluice allows everything" in readme
