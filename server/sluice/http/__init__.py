"""The HTTP port: /healthcheck and /json, as envoyproxy/ratelimit offers them."""
