"""Sluice: a rate-limit decision service speaking Envoy's RateLimitService v3 API."""

__version__ = "0.1.0"
