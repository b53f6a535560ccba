"""Readiness: may this instance be sent calls? One answer for ``/ready`` on the management
port, read when a probe asks (never on the request path).

Ready means: serving (not starting, not draining), a policy version loaded (from the config
database or the local snapshot cache; an empty one counts: it allows everything, as
configured), and the state backend answering a probe hit now.
"""

from __future__ import annotations

from collections.abc import Callable

from sluice.backends import Backend, Hit
from sluice.clock import Clock
from sluice.errors import BackendUnavailableError
from sluice.model import RateLimit, Unit
from sluice.policies.reloader import ReloadStatus
from sluice.policies.snapshot import compile_limit

__all__ = ["PROBE_KEY", "Readiness"]

# The counter the probe touches: a cost-0 hit reads it (the backend's whole round trip:
# connection, script, answer) without counting anything; its state lives one second.
PROBE_KEY = ("sluice-readiness-probe",)
_PROBE = Hit(PROBE_KEY, (compile_limit(RateLimit(1, Unit.SECOND)),), 0)


class Readiness:
    def __init__(
        self,
        *,
        serving: Callable[[], bool],
        config: Callable[[], ReloadStatus | None],
        backend: Backend,
        clock: Clock,
    ) -> None:
        self._serving = serving
        self._config = config
        self._backend = backend
        self._clock = clock

    async def reason(self) -> str | None:
        """None when ready; else why not, one line."""
        if not self._serving():
            return "not serving (starting or draining)"
        status = self._config()
        if status is None or status.source == "none":
            return "no policy version loaded yet"
        try:
            await self._backend.apply([_PROBE], self._clock.now())
        except BackendUnavailableError as exc:
            return f"state backend unavailable: {exc}"
        return None
