"""The config database: engine and connection plumbing (``engine.py``), the :class:`Database`
the stores share (``database.py``), the schema (``tables.py``) and its migrations."""

from __future__ import annotations

from sluice.db.database import Database, schema_head

__all__ = ["Database", "schema_head"]
