"""MySQL and MariaDB: the short texts (message ids, exchanges, routing keys, content types,
ordering keys, inbox keys, relay names) compared byte by byte and trailing spaces included.

``utf8mb4_bin`` is a PAD SPACE collation: ``'k-1'`` and ``'k-1 '`` were one value to it, so a
writer's message id differing from a pending one by trailing spaces failed on the outbox's
unique index, and an inbox took one for the other and acked it unprocessed. The columns move
to the server's NO PAD binary collation (``relay.db.dialects.mysql.no_pad_collation``:
MariaDB's ``utf8mb4_nopad_bin``, MySQL 8's ``utf8mb4_0900_bin``); no two values already stored can
collide in it. A column already in it (a database made by this release) is left as it is.
PostgreSQL and SQLite compare text byte by byte already: nothing changes there.

Each table is rebuilt: stop the relays and the inbox consumers while this runs.
A downgrade fails if it finds two values that differ only by trailing spaces.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql

from relay.db.dialects.mysql import no_pad_collation

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None

PAD = "utf8mb4_bin"
# (table, column, nullable, server default) of every short text, as 0009 left them.
COLUMNS = (
    ("outbox", "message_id", False, "(uuid())"),
    ("outbox", "exchange", False, "''"),
    ("outbox", "routing_key", False, "''"),
    ("outbox", "content_type", False, "'application/octet-stream'"),
    ("outbox", "ordering_key", True, None),
    ("outbox_relays", "owner", False, None),
    ("outbox_buckets", "owner", True, None),
    ("outbox_counters", "name", False, None),
    ("inbox_received", "consumer", False, None),
    ("inbox_received", "message_id", False, None),
    ("inbox_attempts", "consumer", False, None),
    ("inbox_attempts", "message_id", False, None),
)


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name == "mysql":
        _collate(no_pad_collation(bind.dialect))


def downgrade() -> None:
    if op.get_bind().dialect.name == "mysql":
        _collate(PAD)


def _collate(collation: str) -> None:
    """Every short text in ``collation``, but those in it already."""
    bind = op.get_bind()
    current = {
        (table, column): found
        for table, column, found in bind.execute(
            sa.text(
                "SELECT TABLE_NAME, COLUMN_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                "WHERE TABLE_SCHEMA = DATABASE()"
            )
        )
    }
    for table, column, nullable, default in COLUMNS:
        if current.get((table, column)) == collation:
            continue
        op.alter_column(
            table,
            column,
            type_=mysql.VARCHAR(255, collation=collation),
            existing_type=mysql.VARCHAR(255),
            existing_nullable=nullable,
            existing_server_default=sa.text(default) if default else None,
        )
