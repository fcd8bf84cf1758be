"""Owned buckets: relays own buckets of the outbox instead of leasing its rows.

- ``outbox_relays``: a row per relay alive, until its presence runs out.
- ``outbox_buckets``: one row per bucket (``relay.constants.OUTBOX_BUCKETS``), its owner and
  the end of the owner's lease; every bucket starts free.
- ``outbox.lease_owner`` and ``outbox.lease_until`` go: a claim writes nothing to the row. A
  pending row still under a lease is due when that lease ends (``next_attempt_at`` takes
  it), as it would have been: upgrade with the old relays stopped, and rows they had in
  flight are neither lost nor published before their lease ends.
- PostgreSQL: the outbox's fillfactor goes back to the default. 0004 left half of each page
  free so that the claim's lease update stayed on the page; with no such update, the free
  half only doubled the pages a backlog spans, and so the full-page images written after
  each checkpoint (about 500 B of WAL per row over a 1M-row backlog).

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

from relay.db.columns import SHORT_TEXT, UTCDateTime

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None

# The number of buckets as this migration made them: a later change of the constant needs a
# migration of its own (the rows' buckets move with it).
_BUCKETS = 64


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "outbox_relays",
        sa.Column("owner", SHORT_TEXT, primary_key=True),
        sa.Column("alive_until", UTCDateTime(), nullable=False),
    )
    buckets = op.create_table(
        "outbox_buckets",
        sa.Column("bucket", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("owner", SHORT_TEXT, nullable=True),
        sa.Column("lease_until", UTCDateTime(), nullable=True),
    )
    op.bulk_insert(buckets, [{"bucket": b} for b in range(_BUCKETS)])
    op.execute(
        "UPDATE outbox SET next_attempt_at = lease_until "
        "WHERE status = 'pending' AND lease_until > next_attempt_at"
    )
    # Plain ALTER TABLE on both: SQLite has dropped columns itself since 3.35, and a batch
    # copy of the table would drop its dedupe trigger.
    op.execute("ALTER TABLE outbox DROP COLUMN lease_until")
    op.execute("ALTER TABLE outbox DROP COLUMN lease_owner")
    if postgresql:
        op.execute("ALTER TABLE outbox RESET (fillfactor)")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("ALTER TABLE outbox SET (fillfactor = 50)")
    op.add_column("outbox", sa.Column("lease_owner", sa.Text(), nullable=True))
    op.add_column("outbox", sa.Column("lease_until", UTCDateTime(), nullable=True))
    op.drop_table("outbox_buckets")
    op.drop_table("outbox_relays")
