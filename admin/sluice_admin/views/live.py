"""Live usage: per rule, admitted vs rejected over time, refreshing by itself."""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from sluice.errors import SluiceError
from sluice.rlqs.service import RLQS_USAGE_SUFFIX
from sluice.usage.store import MINUTE, SECOND
from sluice_admin import charts, metrics, pending, pins, session
from sluice_admin.auth import User
from sluice_admin.data import AdminData

# label: (seconds shown, resolution). Per-second data is kept for an hour, per-minute for two
# days (sluice/usage/store.py), hence the switch.
RANGES = {
    "5 min": (300, SECOND),
    "1 h": (3600, MINUTE),
    "24 h": (86400, MINUTE),
}
REFRESH_S = 1.5
_NOTICE = "live_notice"


def render() -> None:
    st.title("Live usage")
    data = session.data()
    with session.guarded():
        domain = session.choose_domain([d.domain for d in data.domains()])
        if domain is None:
            st.info("No policies yet, so no usage to show.")
            return
        notice = st.session_state.pop(_NOTICE, None)
        if notice:
            st.success(notice)  # built with escaped user data
        label = st.segmented_control("Range", list(RANGES), default="5 min", key="live_range")
        _usage(data, domain, label or "5 min")


@st.fragment(run_every=REFRESH_S)
def _usage(data: AdminData, domain: str, label: str) -> None:
    session.still_signed_in()  # refreshing by itself: a session ended elsewhere ends here
    window_s, resolution = RANGES[label]
    now = int(session.clock().now())
    since = now - window_s
    with session.guarded():
        series = data.usage(domain, since_s=since - since % resolution, resolution_s=resolution)
        st.caption(
            f"Updated {time.strftime('%H:%M:%S', time.gmtime(now))} UTC, every {REFRESH_S} s; "
            + ("per-second" if resolution == SECOND else "per-minute")
            + " figures."
        )
        if not any(metrics.totals(p, since, now + 1).requests for p in series.values()):
            st.info(
                f"No usage recorded in the last {label} for this domain "
                "(no traffic, or no server reporting to this database)."
            )
            return
        user = session.current_user()
        for rule in sorted(series):
            _rule(data, rule, series[rule], since, now, resolution, user=user, domain=domain)


def _rule(
    data: AdminData,
    rule: str,
    points: list,
    since: int,
    now: int,
    resolution: int,
    *,
    user: User,
    domain: str,
) -> None:
    t = metrics.totals(points, since, now + 1)
    if not t.requests and not t.backend_errors:
        return
    with st.container(border=True):
        st.text(rule)  # a rule id is user-written keys and values: plain text
        if rule.endswith(RLQS_USAGE_SUFFIX):
            st.caption(
                "Reported over RLQS: the data planes (Envoy's rate_limit_quota filter, "
                "sluice-client quotas) decided these requests from Sluice's assignments."
            )
        a, b, c, d, e = st.columns(5)
        a.metric("Admitted", t.allowed)
        b.metric("Rejected", t.over_limit)
        c.metric("Rejection rate", f"{t.rejection_rate:.1%}")
        d.metric("Near limit", t.near_limit)
        e.metric("Rejected in shadow mode", t.shadow_over_limit)
        rows = metrics.rows(points, since, now + 1, resolution)
        st.altair_chart(charts.traffic(rows, resolution), width="stretch")
        offenders = data.top_offenders(rule, since_s=since - since % MINUTE)
        if offenders:
            st.caption("Top offending keys (refused requests)")
            shown = [(pending.offender_values(key), hits) for key, hits in offenders]
            st.dataframe(
                pd.DataFrame(shown, columns=["key", "refused"]),
                hide_index=True,
                width="stretch",
            )
            # Data planes decide RLQS traffic themselves: no server counter to reset there.
            if user.can_edit and not rule.endswith(RLQS_USAGE_SUFFIX):
                _let_in_again(data, user, domain, rule, [key for key, _ in offenders])


def _let_in_again(data: AdminData, user: User, domain: str, rule: str, keys: list[str]) -> None:
    """A button per offending key that resets its counters on every server (a new version
    of the domain's policy, as ``sluice reset`` makes)."""
    with st.expander("Let a key in again"):
        st.caption("Starts the key's counters afresh on every server; History records it.")
        for key in keys:
            descriptor = pins.offender_descriptor(key)
            if descriptor is None:
                continue  # a value holding a comma: not a descriptor a reset can name
            shown = session.escape(pending.offender_values(key))
            if not st.button(f"Let {shown} in again", key=f"live_reset_{rule}_{key}"):
                continue
            try:
                version = data.reset(user, domain, descriptor, comment=f"let {descriptor} in again")
            except SluiceError as exc:
                st.error(session.escape(str(exc)))
                return
            st.session_state[_NOTICE] = session.escape(
                f"{descriptor} starts afresh on every server (version {version} of {domain})."
            )
            st.rerun()


if __name__ == "__main__":
    render()
