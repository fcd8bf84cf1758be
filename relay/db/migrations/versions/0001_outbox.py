"""Create the outbox table and its partial "due rows" index.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

from relay.db.columns import (
    LONG_TEXT,
    PAYLOAD,
    ROW_ID,
    SHORT_TEXT,
    STATUS_TEXT,
    UTCDateTime,
    new_message_id,
    stored_now,
)
from relay.db.schema import index_columns

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None


def upgrade() -> None:
    op.create_table(
        "outbox",
        sa.Column("id", ROW_ID, primary_key=True),
        sa.Column("message_id", SHORT_TEXT, nullable=False, server_default=new_message_id()),
        sa.Column("exchange", SHORT_TEXT, nullable=False, server_default=""),
        sa.Column("routing_key", SHORT_TEXT, nullable=False, server_default=""),
        sa.Column("payload", PAYLOAD, nullable=False),
        sa.Column(
            "content_type", SHORT_TEXT, nullable=False, server_default="application/octet-stream"
        ),
        sa.Column("headers", LONG_TEXT, nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False, server_default=stored_now()),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=False, server_default=stored_now()),
        sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("status", STATUS_TEXT, nullable=False, server_default="pending"),
        sa.Column("sent_at", UTCDateTime(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("lease_owner", sa.Text(), nullable=True),
        sa.CheckConstraint("status IN ('pending', 'sent', 'parked')", name="outbox_status_valid"),
        sa.UniqueConstraint("message_id", name="outbox_message_id_key"),
    )
    op.create_index(
        "outbox_due_idx",
        "outbox",
        index_columns(op.get_bind().dialect, ["next_attempt_at", "id"]),
        postgresql_where=sa.text("status = 'pending'"),
        sqlite_where=sa.text("status = 'pending'"),
    )


def downgrade() -> None:
    op.drop_index("outbox_due_idx", table_name="outbox")
    op.drop_table("outbox")
