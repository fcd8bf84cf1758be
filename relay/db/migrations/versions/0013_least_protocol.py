"""The least protocol a relay must speak to claim (``relay.buckets.fence``): one row, protocol
1 (every release), which a later migration that older relays cannot run beside raises.

Such a migration sets ``least_protocol`` (below) to the protocol it needs, and in its
``upgrade`` updates the row to that protocol and the first release that speaks it (its
``downgrade`` puts the row back). Relays of this release and later read the row every turn: a
relay of an older protocol gives its buckets up, drains and exits naming the release to run.
The releases before this row existed (protocols 1 and 2 before it) do not read it: the
migration must also change what their statements use, so that they fail rather than publish.
``relay migrate`` refuses it while a live relay of an older protocol holds buckets.

A new table only: the relays may run while this runs.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27
"""

import sqlalchemy as sa
from alembic import op

from relay.db.columns import SHORT_TEXT

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None


def upgrade() -> None:
    table = op.create_table(
        "outbox_protocol",
        sa.Column("least_protocol", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("least_release", SHORT_TEXT, nullable=False),
    )
    op.bulk_insert(table, [{"least_protocol": 1, "least_release": "any release"}])


def downgrade() -> None:
    op.drop_table("outbox_protocol")
