"""Sluice's admin app (Streamlit): edit rules, watch live usage, preview a change.

Start it with ``sluice admin``, which gives ``streamlit run`` ``SERVED_PATH`` (the app as an
``st.App``, see served.py); ``APP_PATH`` is the app's script itself (what tests drive).
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["APP_PATH", "SERVED_PATH"]

APP_PATH = Path(__file__).with_name("app.py")
SERVED_PATH = Path(__file__).with_name("served.py")
