"""Overrides, blocks, the allow-list and resets: one exact descriptor each.

Listed with a countdown to their expiry, added and removed by editors through the calls
``sluice override/block/allow/reset`` make; each change is a new version of the domain's
policy, so History shows who did it and why, and every server applies it within a second.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import streamlit as st

from sluice.algorithms import ALGORITHMS, DEFAULT_ALGORITHM
from sluice.errors import SluiceError
from sluice_admin import pins, session
from sluice_admin.auth import User
from sluice_admin.data import AdminData

_NOTICE = "pins_notice"
COUNTDOWN_S = 1.0  # how often the countdowns tick
# What each kind's buttons say, and the comment a change gets when none is written.
_ADD = {"overrides": "Set override", "blocks": "Block", "allows": "Allow"}
_ADDED = {"overrides": "override", "blocks": "block", "allows": "allow"}
_NOUN = {"overrides": "overrides", "blocks": "blocks", "allows": "allow-list entries"}
_REMOVED = {"overrides": "remove override", "blocks": "unblock", "allows": "unallow"}


def render() -> None:
    st.title("Overrides & blocks")
    data = session.data()
    user = session.current_user()
    with session.guarded():
        domain = session.choose_domain([d.domain for d in data.domains()])
        if domain is None:
            st.info("No policies yet: overrides and blocks apply to what a rule limits.")
            return
        notice = st.session_state.pop(_NOTICE, None)
        if notice:
            st.success(notice)  # built with escaped user data
        st.caption(
            "Each applies to one exact descriptor that a rule of the domain limits "
            "(KEY=VALUE,…, as `sluice block` takes it) and is a new version of the policy "
            "(see History). An expired one stops applying at once and stays listed until "
            "the next change prunes it."
            + ("" if user.can_edit else " You are a viewer: only editors may change them.")
        )
        tabs = st.tabs([*pins.KINDS.values(), "Reset a key"], key="pins_tabs")
        for tab, kind in zip(tabs[:-1], pins.KINDS, strict=True):
            with tab:
                _listing(data, user, domain, kind)
                if user.can_edit:
                    _add(data, user, domain, kind)
        with tabs[-1]:
            _reset(data, user, domain)


@st.fragment(run_every=COUNTDOWN_S)
def _listing(data: AdminData, user: User, domain: str, kind: str) -> None:
    with session.guarded():
        view = data.get(domain)
        listed = pins.rows(list(view.policy.pins) if view else [], kind, session.clock().now())
        if not listed:
            st.caption(f"No {_NOUN[kind]} in {session.escape(domain)}.")
            return
        for row in listed:
            text, button = st.columns([6, 1], vertical_alignment="center")
            text.text(row.line)
            if user.can_edit and button.button(
                "Remove", key=f"pins_remove_{kind}_{row.descriptor}"
            ):
                remove = partial(
                    data.delete_pin, user, domain, kind, row.descriptor, comment=_REMOVED[kind]
                )
                _done(remove, f"{_REMOVED[kind].capitalize()}: {row.descriptor}", domain)


def _add(data: AdminData, user: User, domain: str, kind: str) -> None:
    with st.form(f"pins_add_{kind}"):
        descriptor = st.text_input(
            "Descriptor", placeholder="user=alice", key=f"pins_{kind}_descriptor"
        )
        limit = _limit_fields() if kind == "overrides" else None
        expires_in = st.text_input(
            "Expires in",
            placeholder="30s, 10m, 2h, 7d, 1w or 2026-12-04T18:00:00Z; empty: never",
            key=f"pins_{kind}_expires",
        )
        comment = st.text_input("Comment", key=f"pins_{kind}_comment")
        if not st.form_submit_button(_ADD[kind], type="primary", key=f"pins_{kind}_submit"):
            return
    descriptor = descriptor.strip()
    _done(
        lambda: data.put_pin(
            user,
            domain,
            kind,
            descriptor,
            rate_limit=limit,
            expires_in=expires_in.strip() or None,
            comment=comment.strip() or f"{_ADDED[kind]} {descriptor}",
            clock=session.clock(),
        ),
        f"{_ADDED[kind].capitalize()}: {descriptor}",
        domain,
    )


def _limit_fields() -> dict[str, object]:
    a, b, c, d = st.columns(4)
    rpu = a.number_input("Requests per unit", min_value=0, step=1, value=100, key="pins_rpu")
    unit = b.selectbox("Unit", pins.UNITS, key="pins_unit")
    algorithms = list(ALGORITHMS)
    algorithm = c.selectbox(
        "Algorithm", algorithms, index=algorithms.index(DEFAULT_ALGORITHM.name), key="pins_alg"
    )
    burst = d.number_input(
        "Burst",
        min_value=1,
        step=1,
        value=None,
        key="pins_burst",
        help="token_bucket, leaky_bucket, gcra: capacity; empty: the limit itself",
    )
    return pins.override_limit(int(rpu), unit, algorithm, int(burst) if burst else None)


def _reset(data: AdminData, user: User, domain: str) -> None:
    st.caption(
        "Start a descriptor's counters afresh on every server (its rule's limits and its "
        "override's): let a key that was limited in again. The Live usage page offers the "
        "same for each top offender."
    )
    if not user.can_edit:
        return
    with st.form("pins_reset"):
        descriptor = st.text_input("Descriptor", placeholder="user=alice", key="pins_reset_key")
        comment = st.text_input("Comment", key="pins_reset_comment")
        if not st.form_submit_button("Reset counters", type="primary", key="pins_reset_submit"):
            return
    descriptor = descriptor.strip()
    _done(
        lambda: data.reset(
            user, domain, descriptor, comment=comment.strip() or f"reset {descriptor}"
        ),
        f"Counters of {descriptor} start afresh on every server",
        domain,
    )


def _done(change: Callable[[], int | None], what: str, domain: str) -> None:
    """Run ``change`` (a call returning the new version); on success say so at the top of
    the page after a full rerun, else show the server's reason here."""
    try:
        version = change()
    except SluiceError as exc:
        st.error(session.escape(str(exc)))
        return
    done = f" (version {version} of {domain})" if version is not None else " (nothing changed)"
    st.session_state[_NOTICE] = session.escape(what + done)
    st.rerun()


if __name__ == "__main__":
    render()
