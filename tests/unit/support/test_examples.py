"""The nightly run (``SLUICE_FUZZ=nightly``) runs every property test outside tests/abuse ten
times its examples, those with a number of their own (``@settings(max_examples=...)``, which
no profile overrides) included: tests/support/examples.py, tests/conftest.py's profiles."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.support.examples import NIGHTLY_FACTOR

ROOT = Path(__file__).resolve().parents[3]
TESTS = ROOT / "tests"

# Imports the given test modules with the run's profiles (tests/conftest.py) loaded, and prints
# the number of examples each of their property tests runs.
REPORT = """
import importlib, json, sys
import tests.conftest
from hypothesis import settings
found = {}
for name in sys.argv[1:]:
    for attr, test in vars(importlib.import_module(name)).items():
        if getattr(test, "hypothesis", None) is not None:
            chosen = getattr(test, "_hypothesis_internal_use_settings", None) or settings.default
            found[f"{name}.{attr}"] = chosen.max_examples
print(json.dumps(found))
"""


def property_test_modules() -> list[str]:
    paths = [
        path
        for path in TESTS.rglob("test_*.py")
        if "abuse" not in path.relative_to(TESTS).parts and "@given" in path.read_text()
    ]
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in paths)


def examples_per_test(modules: list[str], **env: str) -> dict[str, int]:
    inherited = {k: v for k, v in os.environ.items() if k not in ("SLUICE_FUZZ", "CI")}
    done = subprocess.run(
        [sys.executable, "-c", REPORT, *modules],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**inherited, **env},
        timeout=120,
        check=True,
    )
    found: dict[str, int] = json.loads(done.stdout.splitlines()[-1])
    return found


def test_the_nightly_run_has_ten_times_the_examples_of_every_property_test() -> None:
    modules = property_test_modules()
    # The algorithms' properties and the Lua scripts against memory, among the rest.
    assert "tests.unit.algorithms.test_gcra" in modules
    assert "tests.integration.test_algorithm_scripts" in modules
    usual = examples_per_test(modules)
    nightly = examples_per_test(modules, SLUICE_FUZZ="nightly")
    assert usual.keys() == nightly.keys()
    assert len(usual) >= 25, usual  # 29 when written
    short = {
        name: (usual[name], nightly[name])
        for name in usual
        if nightly[name] != NIGHTLY_FACTOR * usual[name]
    }
    assert not short, f"(usual, nightly) examples, not ten times: {short}"
