"""The server process's start-up: what ``sluice.app`` does to the process once it serves."""

from __future__ import annotations

import json
import subprocess
import sys

PROBE = """
import gc, json
from sluice.app import freeze_startup_heap
before = gc.get_threshold()
freeze_startup_heap()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_serving_freezes_the_start_up_heap_and_collects_the_young_less_often() -> None:
    # In a process of its own: the collector's settings are process-wide.
    out = subprocess.run(
        [sys.executable, "-c", PROBE], check=True, capture_output=True, text=True
    ).stdout
    seen = json.loads(out)
    assert seen["frozen"] > 10_000  # modules, descriptors: out of the collector's sight
    # Only the young generation's threshold changes; the older ones keep Python's defaults.
    assert seen["after"] == [10_000, *seen["before"][1:]]
