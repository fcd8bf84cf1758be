"""The operator console (``relay console``): its audit log, the archive of discarded parked
rows, the links of edited copies to their originals, the sessions ended by a logout, and
indexes of parked rows (by time,
cause and exchange) for its pages.

New tables, and indexes of parked rows only: the relays may run while this runs. Building
an index reads the whole outbox and holds writers' INSERTs meanwhile (``relay migrate``
runs in one transaction, which CREATE INDEX CONCURRENTLY cannot): on a large PostgreSQL
outbox, create them concurrently beforehand (docs/console.md gives the statements) and
this skips them (IF NOT EXISTS). On MySQL and MariaDB, which have no partial indexes, they
are not built: every INSERT would pay for them.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

from relay.db.columns import LONG_TEXT, PAYLOAD, ROW_ID, SHORT_TEXT, UTCDateTime, stored_now
from relay.db.dialects import of
from relay.db.schema import CONSOLE_INDEXES
from relay.records import PARKED

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None
# The indexes as this revision builds them: by exchange whole (0017 keys it by a prefix).
_INDEXES = (
    *CONSOLE_INDEXES[:2],
    ("outbox_parked_exchange_idx", "exchange", "next_attempt_at", "id"),
)


def upgrade() -> None:
    op.create_table(
        "console_audit",
        sa.Column("id", ROW_ID, primary_key=True),
        sa.Column("at", UTCDateTime(), nullable=False, server_default=stored_now()),
        sa.Column("actor", SHORT_TEXT, nullable=False),
        sa.Column("role", SHORT_TEXT, nullable=False),
        sa.Column("action", SHORT_TEXT, nullable=False),
        sa.Column("target", LONG_TEXT, nullable=False),
        sa.Column("rows", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("result", sa.Text(), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "outbox_archive",
        sa.Column("id", ROW_ID, primary_key=True, autoincrement=False),
        sa.Column("message_id", SHORT_TEXT, nullable=False),
        sa.Column("exchange", SHORT_TEXT, nullable=False),
        sa.Column("routing_key", SHORT_TEXT, nullable=False),
        sa.Column("payload", PAYLOAD, nullable=False),
        sa.Column("content_type", SHORT_TEXT, nullable=False),
        sa.Column("headers", LONG_TEXT, nullable=True),
        sa.Column("ordering_key", SHORT_TEXT, nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("archived_at", UTCDateTime(), nullable=False, server_default=stored_now()),
        sa.Column("archived_by", SHORT_TEXT, nullable=False),
    )
    op.create_index("outbox_archive_time_idx", "outbox_archive", ["archived_at"])
    op.create_table(
        "outbox_edits",
        sa.Column("copy_id", ROW_ID, primary_key=True, autoincrement=False),
        sa.Column("original_id", ROW_ID, nullable=False),
        sa.Column("edited_at", UTCDateTime(), nullable=False, server_default=stored_now()),
        sa.Column("edited_by", SHORT_TEXT, nullable=False),
    )
    op.create_index("outbox_edits_original_idx", "outbox_edits", ["original_id"])
    op.create_table(
        "console_sessions_ended",
        sa.Column("session_id", SHORT_TEXT, primary_key=True),
        sa.Column("ends_at", UTCDateTime(), nullable=False),
    )
    if not of(op.get_bind().dialect).partial_indexes:
        return
    parked = sa.text(f"status = '{PARKED}'")
    for name, *columns in _INDEXES:
        op.create_index(
            name,
            "outbox",
            columns,
            postgresql_where=parked,
            sqlite_where=parked,
            if_not_exists=True,
        )


def downgrade() -> None:
    if of(op.get_bind().dialect).partial_indexes:
        for name, *_columns in _INDEXES:
            op.drop_index(name, "outbox")
    op.drop_table("console_sessions_ended")
    op.drop_table("outbox_edits")
    op.drop_table("outbox_archive")
    op.drop_table("console_audit")
