"""What-if: what a proposed limit would have admitted and rejected, before publishing it."""

from __future__ import annotations

import streamlit as st

from sluice.algorithms import ALGORITHMS, Limit
from sluice.model import Unit
from sluice.usage.store import SECOND
from sluice_admin import charts, pending, session, whatif
from sluice_admin.data import AdminData

UNITS = [u.name.lower() for u in Unit if u is not Unit.UNKNOWN]
HOUR_S = 3600

APPROXIMATION = (
    "Recorded usage is kept as per-second totals per rule, not per key, so it is replayed as "
    "if every request of the rule hit **one counter**, each second's requests spread evenly "
    "over that second. For a rule with a counter per client (per user, per address) this "
    "overstates rejections: each client really has its own counter."
)


def render() -> None:
    st.title("What-if")
    st.caption(
        "Replays traffic through the server's own algorithm code to show what a changed limit "
        "would admit and reject. Nothing is published from here."
    )
    data = session.data()
    with session.guarded():
        domain = session.choose_domain([d.domain for d in data.domains()])
        live = data.get(domain) if domain is not None else None
        if live is None:
            st.info("No policies yet: publish a rule first, then try changes to it here.")
            return
        rows = pending.rows(live.policy)
        if not rows:
            st.info("This domain has no rules.")
            return
        labels = [r.label for r in rows]
        limited = next((i for i, r in enumerate(rows) if r.rule.limits), 0)
        index = st.selectbox(
            "Rule",
            range(len(rows)),
            index=limited,
            format_func=labels.__getitem__,
            key="whatif_rule",
        )
        row = rows[index]
        current = whatif.limits_of(row.rule.limits)
        proposal = _proposal(row.rule.limits[0] if row.rule.limits else None, index)
        proposed = [proposal, *current[1:]]
        recorded, synthetic = st.tabs(["Recorded traffic (last hour)", "Synthetic traffic"])
        with recorded:
            _recorded(data, pending.rule_id(live.domain, row.path), current, proposed)
        with synthetic:
            _synthetic(current, proposed, proposal, index)


def _proposal(limit, index: int) -> Limit:  # noqa: ANN001 (RateLimit | None)
    st.subheader("Proposed limit", anchor=False)
    a, b, c, d = st.columns(4)
    rpu = a.number_input(
        "Requests per unit",
        min_value=0,
        step=1,
        value=limit.requests_per_unit if limit else 10,
        key=f"whatif_rpu_{index}",
    )
    unit = b.selectbox(
        "Unit",
        UNITS,
        index=UNITS.index(limit.unit.name.lower()) if limit else UNITS.index("second"),
        key=f"whatif_unit_{index}",
    )
    names = list(ALGORITHMS)
    algorithm = c.selectbox(
        "Algorithm",
        names,
        index=names.index(limit.algorithm) if limit else 0,
        key=f"whatif_alg_{index}",
    )
    burst = d.number_input(
        "Burst",
        min_value=0,
        step=1,
        value=limit.burst if limit and limit.burst is not None else None,
        key=f"whatif_burst_{index}",
        help="token_bucket, leaky_bucket, gcra: capacity; empty: the limit itself",
    )
    if not limit:
        st.caption("The rule has no limit now: the proposal is compared with admitting all.")
    return Limit(
        int(rpu),
        Unit[unit.upper()].seconds,
        ALGORITHMS[algorithm],
        int(burst if burst is not None else rpu),
    )


def _outcome(title: str, now: whatif.Replay, then: whatif.Replay) -> None:
    st.markdown(f"**{title}**")
    a, b, c = st.columns(3)
    a.metric("Admitted (proposed)", then.admitted, delta=then.admitted - now.admitted)
    b.metric(
        "Rejected (proposed)",
        then.rejected,
        delta=then.rejected - now.rejected,
        delta_color="inverse",
    )
    c.metric("Rejection rate (proposed)", f"{then.rejection_rate:.1%}")
    st.caption(
        f"Now: {now.admitted} admitted, {now.rejected} rejected. "
        "The dashed line is what the current limit rejects."
    )


def _recorded(data: AdminData, rule_id: str, current: list[Limit], proposed: list[Limit]) -> None:
    st.info(APPROXIMATION, icon=":material/info:")
    now = int(session.clock().now())
    points = data.usage_of(rule_id, since_s=now - HOUR_S, resolution_s=SECOND)
    traffic = whatif.recorded(points)
    if not traffic:
        st.caption(
            "No usage recorded for this rule in the last hour; try synthetic traffic instead."
        )
        return
    with st.spinner("Replaying the last hour…"):
        before = whatif.simulate(current, traffic)
        after = whatif.simulate(proposed, traffic)
    if after.skipped_hits:
        st.warning(
            f"Only the most recent {whatif.MAX_REPLAY_HITS} requests were replayed "
            f"({after.skipped_hits} older ones left out)."
        )
    _outcome("Over the recorded traffic of the last hour", before, after)
    st.altair_chart(charts.what_if(after, before), width="stretch")


def _synthetic(current: list[Limit], proposed: list[Limit], proposal: Limit, index: int) -> None:
    shape = st.radio("Traffic", ["steady", "bursty"], horizontal=True, key="whatif_shape")
    a, b, c = st.columns(3)
    duration = a.number_input("Duration (s)", 10, 3600, 120, step=10, key="whatif_duration")
    per_second = max(1.0, 2.0 * proposal.requests_per_unit / max(proposal.period_s, 1))
    if shape == "steady":
        rate = b.number_input(
            "Requests / s", 0.0, 10_000.0, round(per_second, 2), key=f"whatif_rate_{index}"
        )
        traffic = whatif.steady(rate, int(duration))
        title = f"Steady {rate:g} requests/s for {duration} s"
    else:
        burst = b.number_input("Burst size", 1, 100_000, 20, key="whatif_burst_size")
        every = c.number_input("Every (s)", 1, 3600, 10, key="whatif_every")
        traffic = whatif.bursty(int(burst), int(every), int(duration))
        title = f"Bursts of {burst} every {every} s for {duration} s"
    with st.spinner("Simulating…"):
        before = whatif.simulate(current, traffic)
        after = whatif.simulate(proposed, traffic)
    _outcome(title, before, after)
    st.altair_chart(charts.what_if(after, before, relative=True), width="stretch")


if __name__ == "__main__":
    render()
