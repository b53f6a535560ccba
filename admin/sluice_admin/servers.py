"""Streamlit glue for the runtime pages (Leases, RLQS buckets): the servers to ask, or a
message saying what to set when there are none or the setting is wrong."""

from __future__ import annotations

import streamlit as st

from sluice.settings import env_name, flag_name
from sluice_admin import runtime, session

__all__ = ["configured"]


def configured() -> list[str] | None:
    """``--admin-servers`` parsed; None (with the reason shown) when the page cannot ask."""
    s = session.settings()
    setting = f"`{flag_name('admin_servers')}` / `{env_name('admin_servers')}`"
    try:
        servers = runtime.parse_servers(s.admin_servers)
    except ValueError as exc:
        st.error(f"{setting}: {exc}")
        return None
    if not servers:
        st.info(
            "This state lives in the servers, not in the config database: start the admin "
            f"with {setting} naming their HTTP ports (http://HOST:PORT,…) and "
            f"`{flag_name('api_token')}` set to their API token."
        )
        return None
    if not s.api_token:
        st.warning(
            f"`{flag_name('api_token')}` is not set: the servers answer only with their API token."
        )
    return servers
