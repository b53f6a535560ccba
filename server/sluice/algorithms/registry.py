"""Algorithm name → module, written out (no registration by import side effect)."""

from __future__ import annotations

from types import ModuleType

from sluice.algorithms import (
    fixed_window,
    gcra,
    leaky_bucket,
    sliding_window_counter,
    sliding_window_log,
    token_bucket,
)

__all__ = ["MODULES"]

MODULES: dict[str, ModuleType] = {
    "fixed_window": fixed_window,
    "sliding_window_log": sliding_window_log,
    "sliding_window_counter": sliding_window_counter,
    "token_bucket": token_bucket,
    "leaky_bucket": leaky_bucket,
    "gcra": gcra,
}
