"""The request path's modules that setup.py compiles with mypyc: what the install built, and
what coverage leaves out (it cannot trace compiled code)."""

from __future__ import annotations

import ast
import importlib
import os
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def compiled_paths() -> list[str]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "COMPILED":
            return list(ast.literal_eval(node.value))
    raise AssertionError("setup.py has no COMPILED list")


def test_coverage_omits_exactly_the_compiled_modules() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    omitted = config["tool"]["coverage"]["run"]["omit"]
    assert [p for p in omitted if not p.startswith("*")] == compiled_paths()


@pytest.mark.skipif(
    os.environ.get("SLUICE_PURE_PYTHON") == "1", reason="an install without compiled modules"
)
def test_the_install_runs_the_compiled_modules() -> None:
    for path in compiled_paths():
        name = path.removeprefix("server/").removesuffix(".py").replace("/", ".")
        module = importlib.import_module(name)
        assert module.__file__ is not None and module.__file__.endswith(".so"), name
