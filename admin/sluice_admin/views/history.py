"""History: every version of a domain with author, time, comment and diff; roll back."""

from __future__ import annotations

import streamlit as st

from sluice.errors import StaleVersionError
from sluice.policies.service import Version
from sluice_admin import session
from sluice_admin.auth import User
from sluice_admin.data import AdminData

_CONFIRM = "history_confirm"
_NOTICE = "history_notice"


def render() -> None:
    st.title("History")
    data = session.data()
    user = session.current_user()
    with session.guarded():
        names = sorted({d.domain for d in data.domains()} | _deleted_domains())
        domain = session.choose_domain(names)
        if domain is None:
            st.info("Nothing has been published yet.")
            return
        notice = st.session_state.pop(_NOTICE, None)
        if notice:
            st.success(notice)  # built with escaped user data
        versions = data.history(domain)
        if not versions:
            st.info("This domain has no history.")
            return
        latest = versions[0].version
        for v in versions:
            _version(data, user, v, latest)


def _deleted_domains() -> set[str]:
    # A deleted domain is still worth showing when it was picked before (to roll it back).
    chosen = st.session_state.get(session.DOMAIN)
    return {chosen} if chosen else set()


def _title(v: Version) -> str:
    when = v.created_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    note = (
        " · deleted" if v.deleted else f" · restores v{v.restored_from}" if v.restored_from else ""
    )
    return f"v{v.version} · {when} · {v.author}{note}"


def _version(data: AdminData, user: User, v: Version, latest: int) -> None:
    with st.container(border=True):
        # Author and comment are user-written: plain text.
        st.text(_title(v) + (" · live" if v.version == latest else ""))
        if v.comment:
            st.text(f"Comment: {v.comment}")
        with st.expander("Diff from the version before"):
            st.code(v.diff or "(no change in the document)", language="diff")
        if v.version == latest or not user.can_edit:
            return
        if st.session_state.get(_CONFIRM) == (v.domain, v.version):
            _confirm(data, user, v.domain, v.version, latest)
        elif st.button(f"Roll back to v{v.version}", key=f"history_rollback_{v.version}"):
            st.session_state[_CONFIRM] = (v.domain, v.version)
            st.rerun()


def _confirm(data: AdminData, user: User, domain: str, target: int, latest: int) -> None:
    """The confirmation in place of its button (not at the top of the page, off-screen): what
    the rollback changes, and a comment for the new version."""
    st.warning(
        f"Roll back {session.escape(domain)} to version {target}? This publishes a new "
        f"version {latest + 1} with version {target}'s rules; every server follows within "
        "a second."
    )
    st.code(data.diff(domain, latest, target) or "(no change in the document)", language="diff")
    comment = st.text_input(
        "Comment", value=f"roll back to v{target}", key=f"history_comment_{target}"
    )
    yes, no = st.columns(2)
    if no.button("Cancel", key="history_cancel"):
        del st.session_state[_CONFIRM]
        st.rerun()
    if not yes.button("Yes, roll back", type="primary", key="history_confirm_yes"):
        return
    del st.session_state[_CONFIRM]
    try:
        with st.spinner("Rolling back…"):
            version = data.rollback(user, domain, target, base_version=latest, comment=comment)
    except StaleVersionError as exc:
        st.error(f"{session.escape(str(exc))} (someone published meanwhile; look again)")
        return
    st.session_state[_NOTICE] = (
        f"Version {version} restores version {target}."
        if version is not None
        else f"Version {target}'s rules are already live; nothing to do."
    )
    st.rerun()


if __name__ == "__main__":
    render()
