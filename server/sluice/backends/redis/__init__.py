"""Redis backend: algorithm state in Redis, every decision one atomic Lua script call."""
