"""The Node.js example (clients/examples/node) runs its own node:test suite against a live
``sluice serve``. Its dependencies are installed here, once, from the committed lockfile."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.processes import SluiceProcess

EXAMPLE = Path(__file__).resolve().parents[2] / "clients" / "examples" / "node"


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        # Failed, not skipped: a silent skip would hide that the example stopped being tested.
        pytest.fail(f"{name} not found: the Node.js example test needs Node.js >= 18 and npm")
    return path


def _ensure_dependencies(npm: str) -> None:
    installed = all(
        (EXAMPLE / "node_modules" / "@grpc" / name / "package.json").is_file()
        for name in ("grpc-js", "proto-loader")
    )
    if installed:
        return
    # `npm ci`: exactly the committed package-lock.json, never a silently newer version.
    result = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, f"npm ci failed:\n{result.stdout}\n{result.stderr}"


def test_node_example_against_a_live_server(sluice: SluiceProcess) -> None:
    node, npm = _tool("node"), _tool("npm")
    _ensure_dependencies(npm)
    result = subprocess.run(
        [node, "--test", "test/"],
        cwd=EXAMPLE,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "SLUICE_GRPC_TARGET": sluice.grpc_target},
    )
    report = result.stdout + result.stderr
    assert result.returncode == 0, report
    counts = dict(re.findall(r"^# (pass|fail|skipped|cancelled) (\d+)$", report, re.M))
    assert counts == {"pass": "3", "fail": "0", "skipped": "0", "cancelled": "0"}, report
