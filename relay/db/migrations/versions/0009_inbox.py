"""The consumers' inbox: the message ids each consumer processed, and its failed attempts
(``relay.inbox``). New tables only: the relays may run while this runs.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

from relay.db.columns import UTCDateTime, stored_now
from relay.db.schema import INBOX_KEY_TEXT

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None


def upgrade() -> None:
    op.create_table(
        "inbox_received",
        sa.Column("consumer", INBOX_KEY_TEXT, primary_key=True),
        sa.Column("message_id", INBOX_KEY_TEXT, primary_key=True),
        sa.Column("received_at", UTCDateTime(), nullable=False, server_default=stored_now()),
    )
    op.create_index("inbox_received_time_idx", "inbox_received", ["received_at"])
    op.create_table(
        "inbox_attempts",
        sa.Column("consumer", INBOX_KEY_TEXT, primary_key=True),
        sa.Column("message_id", INBOX_KEY_TEXT, primary_key=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False, server_default=stored_now()),
    )
    op.create_index("inbox_attempts_time_idx", "inbox_attempts", ["updated_at"])


def downgrade() -> None:
    op.drop_table("inbox_attempts")
    op.drop_table("inbox_received")
