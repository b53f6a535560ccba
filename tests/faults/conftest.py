"""Fixtures of the fault tests: a Cluster with a replica per master, and a replicated master
watched by three Sentinels (the shared Redis fixtures come from ``tests/support/fixtures.py``)."""

from __future__ import annotations

from tests.faults.redis_cluster import replicated_redis_cluster
from tests.faults.redis_sentinel import replicated_redis_sentinel

__all__ = [
    "replicated_redis_cluster",
    "replicated_redis_sentinel",
]
