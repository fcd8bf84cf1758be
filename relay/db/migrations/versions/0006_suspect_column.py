"""The suspect mark gets a column of its own (``outbox.suspect``).

Relays before this one marked a suspect row (``relay.broker.quarantine``) by a phrase in its
``last_error``; rows marked so keep their mark. ``last_error`` stays what operators read.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None

# The phrase the relays before this migration marked a suspect's last_error with.
_MARKED = "%channel closed by the broker%"


def upgrade() -> None:
    # Plain ALTER TABLE on both (see 0005): a batch copy would drop SQLite's dedupe trigger.
    op.add_column(
        "outbox", sa.Column("suspect", sa.Boolean(), nullable=False, server_default=sa.false())
    )
    op.execute(
        sa.text(
            "UPDATE outbox SET suspect = true WHERE status = 'pending' AND last_error LIKE :marked"
        ).bindparams(marked=_MARKED)
    )


def downgrade() -> None:
    op.execute("ALTER TABLE outbox DROP COLUMN suspect")
