"""The console's search by message id prefix: an index of parked rows by message id, byte by
byte (on PostgreSQL by ``text_pattern_ops``: in a database's language collation the ids
that start with a prefix are not one range of the unique index on message id).

Expand only: a new partial index, of parked rows only (a writer's INSERT adds no entry to
it, its row is pending), which no relay reads; relays of every protocol run beside it.
Building it reads the outbox and holds writers' INSERTs meanwhile (``relay migrate`` runs in
one transaction, which CREATE INDEX CONCURRENTLY cannot): on a large PostgreSQL outbox,
create it concurrently beforehand (docs/console.md gives the statement) and this skips it
(IF NOT EXISTS). Not on MySQL and MariaDB, which have no partial indexes: there the unique
index on message id, in a binary collation, is the range.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

from relay.db.dialects import of
from relay.db.schema import CONSOLE_MESSAGE_INDEX
from relay.records import PARKED

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None


def upgrade() -> None:
    if not of(op.get_bind().dialect).partial_indexes:
        return
    parked = sa.text(f"status = '{PARKED}'")
    op.create_index(
        str(CONSOLE_MESSAGE_INDEX.name),
        "outbox",
        ["message_id"],
        postgresql_where=parked,
        sqlite_where=parked,
        postgresql_ops={"message_id": "text_pattern_ops"},
        if_not_exists=True,
    )


def downgrade() -> None:
    if of(op.get_bind().dialect).partial_indexes:
        op.drop_index(str(CONSOLE_MESSAGE_INDEX.name), "outbox")
