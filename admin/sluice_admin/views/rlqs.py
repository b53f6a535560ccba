"""RLQS buckets: the buckets of the data planes' open streams with the assignment each was
last sent, read from the servers (a stream lives in the server it is open to), refreshing
by itself."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from sluice_admin import runtime, session
from sluice_admin import servers as servers_setting

REFRESH_S = 2.0


def render() -> None:
    st.title("RLQS buckets")
    st.caption(
        "Buckets reported over RLQS (Envoy's rate_limit_quota filter, sluice-client quotas): "
        "the assignment each stream was last sent and until when it holds, the limit it is "
        "a share of, and the demand the data plane reports. The busiest first."
    )
    servers_setting.show_per_domain("No policies yet, so no buckets.", _buckets)


@st.fragment(run_every=REFRESH_S)
def _buckets(servers: list[str], domain: str) -> None:
    answers = runtime.ask(
        servers, runtime.RLQS_BUCKETS, token=session.settings().api_token, domain=domain
    )
    st.caption(f"Updated {time.strftime('%H:%M:%S', time.gmtime())} UTC, every {REFRESH_S:g} s.")
    for answer in answers:
        with st.container(border=True):
            st.text(answer.server)
            body = answer.body
            if body is None:
                st.error(f"No answer: {answer.error}")
                continue
            st.caption(
                f"{runtime.plural(body['buckets'], 'bucket')} of {domain} on "
                f"{runtime.plural(body['streams'], 'open stream')} "
                f"(process {body['pid']})"
                + (f"; the {body['omitted']} quietest not shown" if body["omitted"] else "")
            )
            rows = runtime.bucket_rows(body)
            if rows:
                st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch")


if __name__ == "__main__":
    render()
