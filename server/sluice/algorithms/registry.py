"""Algorithm name → module, written out (no registration by import side effect)."""

from __future__ import annotations

from types import ModuleType

from sluice.algorithms import fixed_window

__all__ = ["MODULES"]

MODULES: dict[str, ModuleType] = {
    "fixed_window": fixed_window,
}
