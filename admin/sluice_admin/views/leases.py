"""Leases: the concurrency leases held now, per rule and descriptor, read from the servers
(the leases live there, or in their Redis), refreshing by itself."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from sluice_admin import runtime, session
from sluice_admin import servers as servers_setting

# Listing leases in Redis reads every table (0.5 s of a server's CPU for 10,000 of them).
REFRESH_S = 5.0


def render() -> None:
    st.title("Leases")
    st.caption(
        "Concurrency leases in flight (rules with `rate_limit: {concurrency, lease_ttl}`): "
        "per descriptor, how many are held of the rule's maximum and when they expire "
        "unless renewed. The fullest first."
    )
    servers_setting.show_per_domain("No policies yet, so no leases.", _leases)


@st.fragment(run_every=REFRESH_S)
def _leases(servers: list[str], domain: str) -> None:
    answers = runtime.ask(
        servers, runtime.LEASES, token=session.settings().api_token, domain=domain
    )
    st.caption(f"Updated {time.strftime('%H:%M:%S', time.gmtime())} UTC, every {REFRESH_S:g} s.")
    for names, answer in runtime.by_store(answers):
        with st.container(border=True):
            st.text(", ".join(names))  # the servers' URLs: plain text
            body = answer.body
            if body is None:
                st.error(f"No answer: {answer.error}")
                continue
            store = "this server's memory" if body["store"] == "memory" else body["store"]
            st.caption(
                f"{runtime.plural(body['leases'], 'lease')} held on "
                f"{runtime.plural(body['tables'], 'descriptor')} of {domain} "
                f"(in {store})"
                + (f"; the {body['omitted']} emptiest not shown" if body["omitted"] else "")
            )
            rows = runtime.lease_rows(body)
            if rows:
                st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


if __name__ == "__main__":
    render()
