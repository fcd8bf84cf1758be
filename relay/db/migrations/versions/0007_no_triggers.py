"""No code on the writers' path: the outbox's triggers and their functions go.

- ``outbox_dedupe`` (0004) ran in every writer's INSERT, with its owner's rights on
  PostgreSQL (``SECURITY DEFINER``, which a writer could hijack through its temporary
  schema) and on MariaDB (a trigger runs as its definer), read the sent log with the
  writer's snapshot (a REPEATABLE READ writer could re-add a message acked after its
  snapshot), and did three different things on the three databases. The relay's claim now
  probes the sent log instead (``relay.db.claims``): a re-written id is dropped unpublished,
  whoever wrote it, and the INSERT is a plain INSERT everywhere.
- ``outbox_notify`` (0003, PostgreSQL): a NOTIFY in a transaction takes a database-wide lock
  from its pre-commit to the end of its commit, so every writer's commit waited on every
  other's. Relays now find new rows by a cheap probe of the outbox's newest id
  (``relay.db.probe``).
- ``outbox_counters``: totals the relays keep for ``relay status`` (duplicates dropped).

Old relays must not run on an upgraded outbox: without the trigger they would publish a
re-written id again. Stop them, migrate, start the new ones.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

import importlib

import sqlalchemy as sa
from alembic import op

from relay.db.columns import SHORT_TEXT
from relay.db.schema import COUNTERS

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``):
# relays of the releases before it (protocol 1) would publish a re-written id again.
least_protocol = 2


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.execute("DROP TRIGGER outbox_dedupe" + (" ON outbox" if dialect == "postgresql" else ""))
    if dialect == "postgresql":
        op.execute("DROP FUNCTION outbox_dedupe()")
        op.execute("DROP TRIGGER outbox_notify ON outbox")
        op.execute("DROP FUNCTION outbox_notify()")
    counters = op.create_table(
        "outbox_counters",
        sa.Column("name", SHORT_TEXT, primary_key=True),
        sa.Column("value", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
    )
    op.bulk_insert(counters, [{"name": name, "value": 0} for name in COUNTERS])


def downgrade() -> None:
    """Back to 0006: the triggers as 0003 and 0004 made them (their own statements)."""
    op.drop_table("outbox_counters")
    dialect = op.get_bind().dialect.name
    versions = "relay.db.migrations.versions"
    made = importlib.import_module(f"{versions}.0004_sent_log_lease_column")
    if dialect == "postgresql":
        op.execute(made._PG_DEDUPE)
        op.execute(made._PG_DEDUPE_TRIGGER)
        notify = importlib.import_module(f"{versions}.0003_ordering_index_notify")
        for statement in notify.NOTIFY_STATEMENTS:
            op.execute(statement)
    elif dialect == "mysql":
        op.execute(made._MYSQL_DEDUPE_TRIGGER)
    else:
        op.execute(made._SQLITE_DEDUPE_TRIGGER)
