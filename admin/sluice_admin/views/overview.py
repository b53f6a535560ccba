"""Overview: every domain's traffic now, with sparklines and the rules close to their limits."""

from __future__ import annotations

import streamlit as st

from sluice_admin import charts, metrics, session

NOW_WINDOW_S = 10  # "now" is the last ten complete seconds
SPARK_WINDOW_S = 300


def render() -> None:
    st.title("Overview")
    data = session.data()
    with session.guarded():
        domains = data.domains()
        if not domains:
            st.info("No policies yet. Add rules on the Rules page or import a YAML file.")
            return
        _live(data, [d.domain for d in domains])


@st.fragment(run_every=2)
def _live(data, domains: list[str]) -> None:  # noqa: ANN001 (AdminData; a fragment's args)
    session.still_signed_in()  # refreshing by itself: a session ended elsewhere ends here
    now = int(session.clock().now())
    with session.guarded():
        for domain in domains:
            series = data.usage(domain, since_s=now - SPARK_WINDOW_S)
            _domain(domain, series, now)


def _domain(domain: str, series: dict, now: int) -> None:
    with st.container(border=True):
        st.subheader(domain, anchor=False)
        recent = metrics.domain_totals(series, now - NOW_WINDOW_S, now)
        if recent.requests == 0 and recent.backend_errors == 0:
            st.caption(
                f"No usage recorded in the last {NOW_WINDOW_S} s "
                "(no traffic, or no server reporting to this database)."
            )
        left, middle, right = st.columns(3)
        left.metric("Requests / s", f"{recent.requests / NOW_WINDOW_S:.1f}")
        middle.metric("Rejected", f"{recent.rejection_rate:.1%}")
        right.metric(f"Backend errors (last {NOW_WINDOW_S} s)", recent.backend_errors)
        points = [p for rule_points in series.values() for p in rule_points]
        rows = metrics.rows(points, now - SPARK_WINDOW_S, now)
        st.altair_chart(charts.sparkline(rows), width="stretch")
        hot = []
        for rule, rule_points in sorted(series.items()):
            t = metrics.totals(rule_points, now - NOW_WINDOW_S, now)
            if t.over_limit:
                hot.append(("over", rule, t))
            elif t.near_limit or t.shadow_over_limit:
                hot.append(("near", rule, t))
        for kind, rule, t in hot:
            # Rule ids are user-written keys and values: escaped so they show as written.
            if kind == "over":
                shown = session.escape(rule)
                st.error(f"Over limit: {shown} ({t.over_limit} rejected in {NOW_WINDOW_S} s)")
            else:
                st.warning(
                    f"Near limit: {session.escape(rule)} ({t.near_limit} near, "
                    f"{t.shadow_over_limit} over in shadow mode, in {NOW_WINDOW_S} s)"
                )


if __name__ == "__main__":
    render()
