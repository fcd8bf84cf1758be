"""The relays' presence says their protocol (``relay.buckets.fence``): relays of two protocols
never own buckets at once, whatever order they are started and stopped in.

A nullable column: relays of the releases before run beside this migration (their presence
rows leave it NULL, which counts as protocol 1), and relays of this release wait for them to
stop before they take a bucket.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None


def upgrade() -> None:
    with op.batch_alter_table("outbox_relays") as table:
        table.add_column(sa.Column("protocol", sa.SmallInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("outbox_relays") as table:
        table.drop_column("protocol")
