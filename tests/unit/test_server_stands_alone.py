"""The server installs and runs without the admin app: it never imports sluice_admin, its
base dependencies hold none of the app's, and ``sluice admin`` without them says what to
install in one line."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).parents[2]
SERVER = ROOT / "server" / "sluice"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
ADMIN_ONLY = {"streamlit", "pandas", "pyarrow", "altair"}


def imported_modules(tree: ast.AST) -> set[str]:
    """Every module ``tree`` imports: import statements at any depth, and literal names given
    to importlib.import_module or __import__."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            first = node.args[0]
            if called in ("import_module", "__import__") and isinstance(first, ast.Constant):
                names.add(str(first.value))
    return names


def requirement_name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[(]", requirement, maxsplit=1)[0].lower()


def test_the_server_package_never_imports_the_admin_app() -> None:
    sources = sorted(SERVER.rglob("*.py"))
    assert len(sources) > 20
    offenders = [
        f"{path.relative_to(ROOT)}: {name}"
        for path in sources
        for name in sorted(imported_modules(ast.parse(path.read_text(), str(path))))
        if name == "sluice_admin" or name.startswith("sluice_admin.")
    ]
    assert offenders == []


def test_the_import_walk_sees_lazy_and_dynamic_imports() -> None:
    tree = ast.parse(
        "def f():\n    from sluice_admin import APP_PATH\n"
        "import importlib\nimportlib.import_module('sluice_admin.cli')\n"
    )
    assert {"sluice_admin", "sluice_admin.cli"} <= imported_modules(tree)


def test_base_dependencies_hold_nothing_only_the_admin_app_needs() -> None:
    project = PYPROJECT["project"]
    base = {requirement_name(r) for r in project["dependencies"]}
    assert "grpcio" in base and not base & ADMIN_ONLY
    extras = project["optional-dependencies"]
    assert "streamlit" in {requirement_name(r) for r in extras["admin"]}
    assert "sluice[admin]" in extras["test"]  # the tests run the admin app
    commands = project["entry-points"]["sluice.commands"]
    assert all(target.startswith("sluice_admin.") for target in commands.values())


def test_admin_without_the_extra_says_in_one_line_how_to_install_it() -> None:
    # Streamlit is installed in the test venv; None in sys.modules makes importing it fail as
    # if it were not, for this process only. The command runs as `python -m sluice` does.
    script = (
        "import runpy, sys\n"
        "sys.modules['streamlit'] = None\n"
        "sys.argv = ['sluice', 'admin']\n"
        "runpy.run_module('sluice', run_name='__main__', alter_sys=True)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert result.stdout == ""
    [line] = result.stderr.splitlines()
    assert "pip install 'sluice[admin]'" in line and "streamlit" in line
