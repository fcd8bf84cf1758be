"""Alembic environment: runs on the connection ``relay migrate`` hands over."""

from alembic import context

from relay.db.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
