"""Alembic environment for the config database.

Sluice runs migrations itself (``Database.upgrade``) on a connection it has already opened,
locked and begun a transaction on, so this environment never builds an engine or reads an ini
file: the connection arrives in ``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context

from sluice.db.tables import metadata

connection = context.config.attributes.get("connection")
if connection is None or context.is_offline_mode():
    raise RuntimeError(
        "sluice migrations need a live connection in config.attributes['connection']; "
        "run them through sluice.db.Database.upgrade()"
    )

context.configure(
    connection=connection,
    # Only autogenerate reads this, and migrations are written by hand; it lacks admin_users,
    # which sluice_admin.accounts defines (see sluice.db.tables).
    target_metadata=metadata,
    # SQLite cannot ALTER most things; batch mode rebuilds tables for later migrations.
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)

# The caller's transaction is already open, so this joins it rather than starting another:
# the schema change and the version stamp commit (or roll back) together with the lock.
with context.begin_transaction():
    context.run_migrations()
