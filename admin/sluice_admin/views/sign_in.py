"""Sign in: the only page anyone can see before signing in."""

from __future__ import annotations

import streamlit as st

from sluice_admin import oidc, session


def render() -> None:
    st.title("Sluice admin")
    st.caption("Sign in to see and change rate-limit policies.")
    notice = session.ended_notice()
    if notice is not None:
        st.info(notice)
    _single_sign_on()
    with st.form("sign_in"):
        name = st.text_input("User name", key="sign_in_name")
        password = st.text_input("Password", type="password", key="sign_in_password")
        submitted = st.form_submit_button("Sign in", type="primary")
    if not submitted:
        return
    with st.spinner("Checking…"):
        problem = session.sign_in_as(name.strip(), password)
    if problem is not None:
        st.error(problem)
        return
    st.rerun()


def _single_sign_on() -> None:
    """With single sign-on configured: a button to the identity provider, and, back from it,
    the session started from its answer (or why not)."""
    try:
        config = session.sso_config()
    except ValueError as exc:
        st.error(f"Single sign-on is misconfigured: {exc}")
        return
    if config is None:
        return
    claims = st.user.to_dict()  # the provider's answer, once back from it
    if claims.get("is_logged_in"):
        problem = session.sign_in_sso(claims, config)
        if problem is None:
            st.rerun()
        if problem:
            st.error(problem)
    if st.button("Sign in with single sign-on", key="sign_in_sso"):
        st.login(oidc.PROVIDER)
    st.divider()


if __name__ == "__main__":
    render()
