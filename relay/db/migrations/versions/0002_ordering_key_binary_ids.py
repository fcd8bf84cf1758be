"""Add the optional per-key ordering column; compare message ids byte by byte on PostgreSQL.

A message id is an opaque token: ordering it by the database's locale (strcoll) buys
nothing and makes every insert into its unique index markedly slower than a byte compare.
SQLite already compares text byte by byte.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

from relay.db.columns import SHORT_TEXT

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None


def upgrade() -> None:
    op.add_column("outbox", sa.Column("ordering_key", SHORT_TEXT, nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.execute('ALTER TABLE outbox ALTER COLUMN message_id TYPE text COLLATE "C"')


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute('ALTER TABLE outbox ALTER COLUMN message_id TYPE text COLLATE "default"')
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("ordering_key")
