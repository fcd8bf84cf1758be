"""Index the pending rows by ordering key; notify listening relays of new rows (PostgreSQL).

The index serves the ordered claim's "is an earlier row of this key still pending?" probe.
The trigger runs once per INSERT statement, whoever the writer is (an application, Spark's
JDBC writer, psql), so a relay waiting on ``LISTEN outbox`` wakes when the rows commit
instead of at its next poll. Notifications of one transaction are folded into one.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

from relay.db.schema import index_columns

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None


# Its function and its trigger (dropped by 0007, whose downgrade makes them again).
NOTIFY_STATEMENTS = (
    "CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN PERFORM pg_notify('outbox', ''); RETURN NULL; END $$",
    "CREATE TRIGGER outbox_notify AFTER INSERT ON outbox "
    "FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify()",
)


def upgrade() -> None:
    op.create_index(
        "outbox_ordering_idx",
        "outbox",
        index_columns(op.get_bind().dialect, ["ordering_key", "id"]),
        postgresql_where=sa.text("status = 'pending' AND ordering_key IS NOT NULL"),
        sqlite_where=sa.text("status = 'pending' AND ordering_key IS NOT NULL"),
    )
    if op.get_bind().dialect.name == "postgresql":
        for statement in NOTIFY_STATEMENTS:
            op.execute(statement)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER outbox_notify ON outbox")
        op.execute("DROP FUNCTION outbox_notify()")
    op.drop_index("outbox_ordering_idx", table_name="outbox")
