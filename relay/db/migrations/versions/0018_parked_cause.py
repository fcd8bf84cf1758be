"""A row's cause beside its last error (``outbox.cause``), and the console's index of parked
rows by it: the console listed causes by the reasons a walk of two seconds read, and lost
whole causes past it (600,000 parked rows); its filters bound every reason text of a cause
(65,535 of them failed the statement); and a cause read from an error's first 200
characters split one error naming 600 tenants into 335 causes.

Expand only: a nullable column (no rewrite of the table on any of the three databases) and
a partial index of parked rows (a writer's INSERT adds no entry to it, its row is pending).
Relays of the release before run beside it: they write no cause, and the rows they park are
sorted by the relays of this release (``relay.db.causes``). Building the index reads the
outbox and holds writers' INSERTs meanwhile: on a large PostgreSQL outbox, create it
concurrently beforehand (docs/console.md gives the statement) and this skips it (IF NOT
EXISTS). 0014's index of parked rows by reason prefix, which the consoles of the release
before read, is dropped a release later. Not on MySQL and MariaDB, which have no partial
indexes: there the console walks the parked range of the due index.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

from relay.db.columns import SHORT_TEXT
from relay.db.dialects import of
from relay.db.schema import CONSOLE_CAUSE_INDEX
from relay.records import PARKED

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None


def upgrade() -> None:
    # Frozen here as this revision made it (the model may change later).
    op.add_column("outbox", sa.Column("cause", SHORT_TEXT, nullable=True))
    if of(op.get_bind().dialect).partial_indexes:
        name, *columns = CONSOLE_CAUSE_INDEX
        parked = sa.text(f"status = '{PARKED}'")
        op.create_index(
            str(name),
            "outbox",
            columns,
            postgresql_where=parked,
            sqlite_where=parked,
            if_not_exists=True,
        )


def downgrade() -> None:
    if of(op.get_bind().dialect).partial_indexes:
        op.drop_index(str(CONSOLE_CAUSE_INDEX[0]), "outbox", if_exists=True)
    # Not a batch (SQLite's copy of the table would lose the expression indexes it cannot
    # reflect, 0014's by reason prefix): every database here drops a column in place.
    op.execute("ALTER TABLE outbox DROP COLUMN cause")
