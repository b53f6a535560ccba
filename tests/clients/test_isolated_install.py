"""clients/python is its own light distribution: installed alone (grpcio and protobuf only)
it works against a live Sluice, and the server is nowhere to be imported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.processes import SluiceProcess

CLIENT_DIR = Path(__file__).resolve().parents[2] / "clients" / "python"

PROBE = textwrap.dedent(
    """
    import importlib.metadata, importlib.util, json, pathlib, sys
    import sluice_client
    from sluice_client import Client

    with Client(sys.argv[1]) as client:
        decision = client.check("clients", [{"user": sys.argv[2]}])
    installed = sorted(d.metadata["Name"].lower() for d in importlib.metadata.distributions())
    print(json.dumps({
        "allowed": decision.allowed,
        "remaining": decision.statuses[0].remaining,
        "server_importable": importlib.util.find_spec("sluice") is not None,
        "typed": pathlib.Path(sluice_client.__file__).with_name("py.typed").is_file(),
        "distributions": installed,
    }))
    """
)


@pytest.mark.slow
def test_installs_alone_and_talks_to_sluice(
    tmp_path: Path, sluice: SluiceProcess, unique: str
) -> None:
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources.
    source = tmp_path / "src"
    shutil.copytree(
        CLIENT_DIR, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    venv = tmp_path / "venv"
    # No pip inside the venv: the test's own pip installs into it (--python), which saves
    # bootstrapping pip and reuses the wheel cache.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=60)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", python, "install", "-q", source],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert install.returncode == 0, install.stderr

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [python, "-c", PROBE, sluice.grpc_target, unique],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,  # nothing of the checkout on sys.path
        env=env,
    )
    assert probe.returncode == 0, probe.stderr
    result = json.loads(probe.stdout)
    assert result["allowed"] is True and result["remaining"] == 2
    assert result["server_importable"] is False
    assert result["typed"] is True
    # grpcio and protobuf (and what they pull in), nothing of the server's.
    assert {"sluice-client", "grpcio", "protobuf"} <= set(result["distributions"])
    for server_dependency in ("sluice", "sqlalchemy", "aiohttp", "pyyaml", "redis"):
        assert server_dependency not in result["distributions"]
