"""Sign in: the only page anyone can see before signing in."""

from __future__ import annotations

import streamlit as st

from sluice_admin import session


def render() -> None:
    st.title("Sluice admin")
    st.caption("Sign in to see and change rate-limit policies.")
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


if __name__ == "__main__":
    render()
