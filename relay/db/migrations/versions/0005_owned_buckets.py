"""Owned buckets: which relays are alive, and which relay owns each bucket of the outbox.

- ``outbox_relays``: a row per relay alive, until its presence runs out.
- ``outbox_buckets``: one row per bucket (``relay.constants.OUTBOX_BUCKETS``), its owner and
  the end of the owner's lease; every bucket starts free.

Relays of the old version lease rows instead (``lease_until``); stop them before the new
ones start, as for 0004: rows they still hold are due when their lease ends.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

from relay.db.schema import UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The number of buckets as this migration made them: a later change of the constant needs a
# migration of its own (the rows' buckets move with it).
_BUCKETS = 64


def upgrade() -> None:
    op.create_table(
        "outbox_relays",
        sa.Column("owner", sa.Text(), primary_key=True),
        sa.Column("alive_until", UTCDateTime(), nullable=False),
    )
    buckets = op.create_table(
        "outbox_buckets",
        sa.Column("bucket", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("owner", sa.Text(), nullable=True),
        sa.Column("lease_until", UTCDateTime(), nullable=True),
    )
    op.bulk_insert(buckets, [{"bucket": b} for b in range(_BUCKETS)])


def downgrade() -> None:
    op.drop_table("outbox_buckets")
    op.drop_table("outbox_relays")
