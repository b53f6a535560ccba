"""Fixtures of the fault tests: the private Redis deployments of the integration tests, and a
Cluster with a replica per master."""

from __future__ import annotations

from tests.faults.redis_cluster import replicated_redis_cluster
from tests.integration.redis_servers import private_redis, redis_cluster, redis_sentinel

__all__ = ["private_redis", "redis_cluster", "redis_sentinel", "replicated_redis_cluster"]
