"""Fixtures of the fault tests: the private Redis deployments of the integration tests, a
Cluster with a replica per master, and a replicated master watched by three Sentinels."""

from __future__ import annotations

from tests.faults.redis_cluster import replicated_redis_cluster
from tests.faults.redis_sentinel import replicated_redis_sentinel
from tests.integration.redis_servers import private_redis, redis_cluster

__all__ = [
    "private_redis",
    "redis_cluster",
    "replicated_redis_cluster",
    "replicated_redis_sentinel",
]
