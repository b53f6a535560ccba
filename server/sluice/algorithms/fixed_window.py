"""Fixed window, exactly as envoyproxy/ratelimit counts.

Windows are aligned to the Unix epoch on whole seconds, and every hit is counted, rejected
ones included (Redis ``INCRBY`` semantics), so a client that keeps hammering stays limited.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.algorithms import Outcome

__all__ = ["WindowState", "step"]


@dataclass(frozen=True, slots=True)
class WindowState:
    window_start_s: int
    count: int

    def expires_at_s(self, window_s: int) -> int:
        return self.window_start_s + window_s


def step(
    state: WindowState | None, limit: int, window_s: int, now: float, cost: int
) -> tuple[WindowState, Outcome]:
    now_s = int(now)
    start = now_s - now_s % window_s
    count = state.count if state is not None and state.window_start_s == start else 0
    count += cost
    allowed = count <= limit
    reset_s = start + window_s - now_s
    return WindowState(start, count), Outcome(allowed, limit - count if allowed else 0, reset_s)
