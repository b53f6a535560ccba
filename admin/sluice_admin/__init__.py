"""Sluice's admin app (Streamlit): edit rules, watch live usage, preview a change.

Start it with ``sluice admin``; ``APP_PATH`` is the script ``streamlit run`` is given.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["APP_PATH"]

APP_PATH = Path(__file__).with_name("app.py")
