"""Streamlit glue for the runtime pages (Leases, RLQS buckets): the servers to ask, or a
message saying what to set when there are none or the setting is wrong."""

from __future__ import annotations

from collections.abc import Callable

import streamlit as st

from sluice.settings import env_name, flag_name
from sluice_admin import runtime, session

__all__ = ["configured", "show_per_domain"]


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


def show_per_domain(empty: str, show: Callable[[list[str], str], None]) -> None:
    """The runtime pages' common part: the servers to ask and the domain picked, then
    ``show(servers, domain)``; ``empty`` is said when there are no policies."""
    servers = configured()
    if servers is None:
        return
    with session.guarded():
        domain = session.choose_domain([d.domain for d in session.data().domains()])
        if domain is None:
            st.info(empty)
            return
        show(servers, domain)
