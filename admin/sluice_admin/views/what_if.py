"""What-if: what a proposed limit would have admitted and rejected, before publishing it."""

from __future__ import annotations

import streamlit as st

from sluice.algorithms import ALGORITHMS, DEFAULT_ALGORITHM, Limit
from sluice.model import Unit
from sluice.usage.store import MINUTE, SECOND
from sluice_admin import charts, pending, session, suggest, whatif
from sluice_admin.data import AdminData
from sluice_admin.pending import LIMIT, LimitFields, RuleRow
from sluice_admin.views import rules as rules_page

UNITS = [u.name.lower() for u in Unit if u is not Unit.UNKNOWN]
HOUR_S = 3600
DAY_S = 86400

PER_KEY = (
    "Replayed **per key**, as the server decides: each key its own counter, each second's "
    "requests of a key at random instants of that second (as many clients' requests "
    "arrive; always the same instants for the same recording). The heaviest keys of every "
    "second are recorded by name and replay exactly; the others only as a histogram, so "
    "their outcome lies between two groupings of it, and the ± figure is half that range."
)
APPROXIMATION = (
    "No per-key usage was recorded for this rule in the last hour, only per-second totals, "
    "so it is replayed as if every request of the rule hit **one counter**, each second's "
    "requests spread evenly over that second. For a rule with a counter per client (per "
    "user, per address) this overstates rejections: each client really has its own counter."
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
        rule_id = pending.rule_id(live.domain, row.path)
        recorded, synthetic, suggested = st.tabs(
            ["Recorded traffic (last hour)", "Synthetic traffic", "Suggested limit"]
        )
        hour = _LastHour(data, rule_id)
        with recorded:
            _recorded(hour, current, proposed)
        with synthetic:
            _synthetic(current, proposed, proposal, index)
        with suggested:
            _suggested(data, hour, row, rule_id, current)


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


def _outcome(
    title: str, now: whatif.Replay, then: whatif.Replay, *, label: str = "proposed"
) -> None:
    st.markdown(f"**{title}**")
    a, b, c = st.columns(3)
    a.metric(f"Admitted ({label})", then.admitted, delta=then.admitted - now.admitted)
    b.metric(
        f"Rejected ({label})",
        then.rejected,
        delta=then.rejected - now.rejected,
        delta_color="inverse",
    )
    c.metric(f"Rejection rate ({label})", f"{then.rejection_rate:.1%}")
    if then.error_bound or now.error_bound:
        st.caption(
            f"Error bound: ± {then.error_bound} admitted (and so rejected) with the {label} "
            f"limit, ± {now.error_bound} now."
        )
    st.caption(
        f"Now: {now.admitted} admitted, {now.rejected} rejected. "
        "The dashed line is what the current limit rejects."
    )


class _LastHour:
    """A rule's recorded last hour, read once per run, and its replays by limits (each tab
    replays the current limit: once is enough, a replay of a busy hour takes a second)."""

    def __init__(self, data: AdminData, rule_id: str) -> None:
        now = int(session.clock().now())
        points = data.usage_of(rule_id, since_s=now - HOUR_S, resolution_s=SECOND)
        self.totals = whatif.recorded(points)
        self.keys = whatif.key_traffic(data.key_record(rule_id, since_s=now - HOUR_S), self.totals)
        self._replays: dict[str, whatif.Replay] = {}

    @property
    def per_key(self) -> bool:
        return not self.keys.empty

    def replay(self, limits: list[Limit]) -> whatif.Replay:
        """Per key when the store has per-key figures, else on one counter."""
        key = repr(limits)
        if key not in self._replays:
            with st.spinner("Replaying the last hour…"):
                self._replays[key] = (
                    whatif.predict(limits, self.keys)
                    if self.per_key
                    else whatif.simulate(limits, self.totals)
                )
        return self._replays[key]

    def missing(self) -> bool:
        """True, saying so, when nothing was recorded for the rule in the last hour."""
        if self.totals:
            return False
        st.caption(
            "No usage recorded for this rule in the last hour; try synthetic traffic instead."
        )
        return True


def _recorded(hour: _LastHour, current: list[Limit], proposed: list[Limit]) -> None:
    if hour.missing():
        return
    before, after = hour.replay(current), hour.replay(proposed)
    st.info(PER_KEY if hour.per_key else APPROXIMATION, icon=":material/info:")
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


def _suggested(
    data: AdminData, hour: _LastHour, row: RuleRow, rule_id: str, current: list[Limit]
) -> None:
    st.caption(
        "Each key's peak rate is the most requests it sent in one second. The suggestion is "
        "the lowest limit per second that only the fastest keys you choose exceeded."
    )
    a, b = st.columns(2)
    window = a.radio(
        "Peaks over", ["last hour", "last day"], horizontal=True, key="whatif_peak_window"
    )
    top_pct = b.number_input(
        "Refuse the top % of keys", 0.0, 100.0, 1.0, step=0.5, key="whatif_top_pct"
    )
    now = int(session.clock().now())
    span, resolution = (HOUR_S, SECOND) if window == "last hour" else (DAY_S, MINUTE)
    rates = suggest.peak_rates(
        data.key_record(rule_id, since_s=now - span, resolution_s=resolution)
    )
    limit = suggest.suggested_limit(rates, top_pct)
    if limit is None:
        st.caption(f"No per-key usage recorded for this rule in the {window}.")
        return
    cells = st.columns(5)
    cells[0].metric("Keys", rates.keys)
    for cell, p in zip(cells[1:4], (50, 90, 99), strict=True):
        cell.metric(f"p{p} peak / s", rates.percentile(p))
    cells[4].metric("Max peak / s", rates.percentile(100))
    if rates.keys > rates.named:
        st.caption(
            f"{rates.named} keys by name; {rates.keys - rates.named} more counted from the "
            "busiest second of the others, at their share of its histogram."
        )
    algorithm = row.rule.limits[0].algorithm if row.rule.limits else DEFAULT_ALGORITHM.name
    st.metric("Suggested limit (requests / second)", limit)
    proposal = [Limit(limit, 1, ALGORITHMS[algorithm], limit), *current[1:]]
    if not hour.missing():
        _outcome(
            "The suggestion over the last hour",
            hour.replay(current),
            hour.replay(proposal),
            label="suggested",
        )
    if session.current_user().can_edit and st.button(
        "Make it a pending edit", key="whatif_use_suggestion", icon=":material/edit:"
    ):
        _to_pending(data, row, LimitFields(limit, "second", algorithm, None))


def _to_pending(data: AdminData, row: RuleRow, fields: LimitFields) -> None:
    """The rule's first limit replaced by ``fields`` in the domain's pending edit (kept with
    any other pending changes; published from Rules, after its diff)."""
    draft = rules_page.draft(data, row.domain)
    target = next((r for r in pending.rows(draft.policy) if r.path == row.path), None)
    if target is None:
        st.error("The pending edit no longer has this rule: see Rules.")
        return
    form = pending.form_from_rule(target.rule)
    form.mode = LIMIT
    form.limits = [fields, *form.limits[1:]] if target.rule.limits else [fields]
    docs = pending.put_rule(
        pending.document_rules(draft.policy), row.path[:-1], row.path, form.document()
    )
    if rules_page.apply_edit(data, draft, docs):
        st.success(
            f"{row.label}: {fields.requests_per_unit} / second is now a pending edit. "
            "Review and publish it on the Rules page."
        )


if __name__ == "__main__":
    render()
