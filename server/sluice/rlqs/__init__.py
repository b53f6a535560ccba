"""Envoy's Rate Limit Quota Service: quota assignments that data planes enforce locally."""
