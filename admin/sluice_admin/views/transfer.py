"""Import / export: envoyproxy/ratelimit YAML in and out."""

from __future__ import annotations

import streamlit as st

from sluice.errors import ConfigError
from sluice.policies.yaml_format import dump_policies
from sluice_admin import pending, session
from sluice_admin.auth import User
from sluice_admin.data import AdminData

_NOTICE = "transfer_notice"
MAX_UPLOAD_BYTES = 1024 * 1024


def render() -> None:
    st.title("Import / export")
    data = session.data()
    user = session.current_user()
    with session.guarded():
        notice = st.session_state.pop(_NOTICE, None)
        if notice:
            st.success(notice)  # built with escaped user data
        _export(data)
        st.divider()
        _import(data, user)


def _export(data: AdminData) -> None:
    st.subheader("Export", anchor=False)
    views = data.domains()
    if not views:
        st.info("Nothing to export yet.")
        return
    names = [v.domain for v in views]
    chosen = st.multiselect("Domains", names, default=names, key="transfer_domains")
    text = dump_policies([v.policy for v in views if v.domain in chosen])
    st.download_button(
        "Download YAML",
        text,
        file_name="ratelimit.yaml",
        mime="application/yaml",
        disabled=not chosen,
        key="transfer_download",
    )
    with st.expander("Preview"):
        st.code(text, language="yaml")


def _import(data: AdminData, user: User) -> None:
    st.subheader("Import", anchor=False)
    st.caption(
        "An envoyproxy/ratelimit YAML file (several domains separated by ---; JSON is YAML "
        "too). It is checked by the server's loader first; a file with any problem changes "
        "nothing."
    )
    upload = st.file_uploader("Policy file", type=["yaml", "yml", "json"], key="transfer_file")
    if upload is None:
        return
    if upload.size > MAX_UPLOAD_BYTES:
        # Streamlit's own limit (sluice admin sets it) stops bigger uploads first; this holds
        # when the app is started some other way.
        st.error(f"The file is larger than {MAX_UPLOAD_BYTES // 1024} KiB; nothing was imported.")
        return
    try:
        text = upload.getvalue().decode("utf-8")
    except UnicodeDecodeError:
        st.error("The file is not UTF-8 text.")
        return
    try:
        policies = data.validate_document(text, upload.name)
    except ConfigError as exc:
        st.error(f"The file has {len(exc.problems)} problem(s); nothing was imported:")
        st.code("\n".join(exc.problems), language=None)
        return
    # Rules counted as the Rules page lists them: nested ones too, not only the top level.
    counted = [f"{p.domain} ({len(pending.rows(p))} rules)" for p in policies]
    st.text("Valid: " + ", ".join(counted))
    if not user.can_edit:
        st.caption("You are a viewer: only editors may import.")
        return
    comment = st.text_input("Comment", value=f"import {upload.name}", key="transfer_comment")
    if st.button("Import", type="primary", key="transfer_import"):
        with st.spinner("Importing…"):
            changed = data.import_document(user, text, upload.name, comment=comment)
        summary = ", ".join(f"{session.escape(d)} → v{v}" for d, v in changed.items())
        summary = summary or "no changes"
        st.session_state[_NOTICE] = f"Imported: {summary}."
        st.rerun()


if __name__ == "__main__":
    render()
