"""Entry point of the admin app: the sign-in gate, then navigation over the pages.

Until someone signs in, the only page registered is the sign-in page, so no other page can
be reached by URL either. Every run checks the session (session.authenticate): a reload or a
deep link finds it through the cookie, and a session ended anywhere ends here too.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from sluice_admin import session

VIEWS = Path(__file__).with_name("views")

PAGES = [
    ("overview.py", "Overview", ":material/monitoring:"),
    ("rules.py", "Rules", ":material/rule:"),
    ("live.py", "Live usage", ":material/show_chart:"),
    ("what_if.py", "What-if", ":material/science:"),
    ("pins.py", "Overrides & blocks", ":material/block:"),
    ("history.py", "History", ":material/history:"),
    ("leases.py", "Leases", ":material/lock_clock:"),
    ("rlqs.py", "RLQS buckets", ":material/water_drop:"),
    ("transfer.py", "Import / export", ":material/swap_vert:"),
]
ADMIN_PAGES = [("users.py", "Users", ":material/group:")]  # registered for admins only

# The tab's icon is an emoji, drawn by the browser: without one, Streamlit makes the current
# page's :material/…: icon the favicon and fetches it from fonts.gstatic.com (the icons in the
# sidebar come from the font Streamlit serves itself). The app talks to no other host.
st.set_page_config(page_title="Sluice admin", page_icon="🚦", layout="wide")

user = session.authenticate()
session.send_redirect()  # after a sign-in or a sign-out: to set or drop the cookie
if user is None:
    # The sign-in page answers every page's address too, so a bookmark or a deep link shows
    # the form (not "Page not found") and, once signed in, its page: the pages' own code is
    # still not registered.
    gate = [st.Page(VIEWS / "sign_in.py", title="Sign in", default=True)]
    gate += [
        st.Page(VIEWS / "sign_in.py", title="Sign in", url_path=Path(name).stem)
        for name, _, _ in PAGES + ADMIN_PAGES
    ]
    navigation = st.navigation(gate, position="hidden")
else:
    navigation = st.navigation(
        [
            st.Page(VIEWS / name, title=title, icon=icon)
            for name, title, icon in PAGES + (ADMIN_PAGES if user.can_manage_users else [])
        ]
    )
    st.sidebar.text(f"Signed in as {user.name} ({user.role.value})")
    if st.sidebar.button("Sign out", key="sign_out"):
        session.sign_out()
        st.rerun()
navigation.run()
