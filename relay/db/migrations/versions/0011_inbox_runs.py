"""The inbox's attempts say which delivery is in its handler (``running``) and when the first
failure was (``first_failed_at``, for the dead letter's headers).

An attempt was charged to every delivery that came again, before anything ran: prefetched
messages returned by a stopped consumer, and deliveries requeued on a database error, were
charged for failures that never happened. Now a delivery that comes again marks its run, and
the next delivery charges it only if the mark is still there (the run died inside the
handler). New columns with defaults: consumers of the release before may run meanwhile;
stop them before the new ones start (they charge as before).

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

from relay.db.columns import UTCDateTime

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None


def upgrade() -> None:
    with op.batch_alter_table("inbox_attempts") as table:
        table.add_column(
            sa.Column("running", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        table.add_column(sa.Column("first_failed_at", UTCDateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("inbox_attempts") as table:
        table.drop_column("first_failed_at")
        table.drop_column("running")
