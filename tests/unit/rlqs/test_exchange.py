"""The memory backend's exchange: one instance, granted every limit whole."""

from __future__ import annotations

from sluice.rlqs.exchange import LocalExchange
from tests.support.rlqs_streams import run


@run
async def test_a_lone_instance_is_granted_every_limit() -> None:
    grants = await LocalExchange().exchange({("d", "k", "v"): 3.5, ("d", "k", "w"): 0.1})
    assert grants == {("d", "k", "v"): 1.0, ("d", "k", "w"): 1.0}
