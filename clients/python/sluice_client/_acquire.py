"""acquire()'s policy, shared by Client and AsyncClient: after each decision, wait how long,
then return or check again, or give up. Pure, so the sync and async loops cannot disagree."""

from __future__ import annotations

from dataclasses import dataclass

from sluice_client.errors import RateLimited
from sluice_client.types import Decision

__all__ = ["MIN_RETRY_WAIT_S", "Step", "next_step"]

# Sluice may report a reset of 0 just as a window turns; re-checking at once would spin.
MIN_RETRY_WAIT_S = 0.01


@dataclass(frozen=True, slots=True)
class Step:
    wait_s: float
    done: bool  # True: return the decision after the wait; False: check again after it


def next_step(decision: Decision, *, budget_s: float, max_wait_s: float) -> Step:
    """The next step with ``budget_s`` of the caller's ``max_wait_s`` left; raises
    RateLimited when waiting cannot (or can never) get the request admitted in time."""
    if decision.allowed:
        if decision.delay_s > budget_s:
            # Sluice has already queued (and counted) this request; it is refused anyway
            # because the caller will not wait its turn.
            raise RateLimited(
                f"admitted after a {decision.delay_s:.3f}s delay, longer than the "
                f"{max_wait_s}s max_wait_s allows",
                decision=decision,
            )
        return Step(decision.delay_s, done=True)
    retry = decision.retry_after_s
    if retry is None:
        raise RateLimited(_never(decision), decision=decision)
    wait = max(retry, MIN_RETRY_WAIT_S)
    if wait > budget_s:
        raise RateLimited(
            f"rate limited: retry after {retry:.3f}s, beyond the {max_wait_s}s max_wait_s",
            decision=decision,
        )
    return Step(wait, done=False)


def _never(decision: Decision) -> str:
    reasons = sorted({s.reason for s in decision.statuses if not s.allowed and s.reason})
    return "rate limited: " + ("; ".join(reasons) or "Sluice gave no time to retry after")
