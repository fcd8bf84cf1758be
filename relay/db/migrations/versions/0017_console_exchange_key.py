"""The console's index of parked rows by exchange keyed by the exchange's first 255
characters, not the whole of it: a row a writer gave a long exchange (6,000 random bytes,
which no broker takes) is parked as malformed, and its entry in 0014's index passed a
B-tree entry's limit on PostgreSQL ("index row size exceeds btree maximum 2704"): the
relay's parking statement failed, and with it every other change of its settle, at every
retry.

Expand and contract in one: no relay reads either index (the console's pages do); relays of
every protocol run beside it. Building it reads the outbox and holds writers' INSERTs
meanwhile: on a large PostgreSQL outbox, create it concurrently beforehand (docs/console.md
gives the statement) and this skips it (IF NOT EXISTS). Not on MySQL and MariaDB, which
have no partial indexes (their exchange column holds 255 characters).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-29
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

from relay.db.dialects import of
from relay.db.schema import CONSOLE_EXCHANGE_INDEX
from relay.records import PARKED

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None
_WHOLE = "outbox_parked_exchange_idx"


def upgrade() -> None:
    if not of(op.get_bind().dialect).partial_indexes:
        return
    name, *columns = CONSOLE_EXCHANGE_INDEX
    _parked_index(str(name), columns)
    op.drop_index(_WHOLE, "outbox", if_exists=True)


def downgrade() -> None:
    if not of(op.get_bind().dialect).partial_indexes:
        return
    _parked_index(_WHOLE, ["exchange", "next_attempt_at", "id"])
    op.drop_index(str(CONSOLE_EXCHANGE_INDEX[0]), "outbox", if_exists=True)


def _parked_index(name: str, columns: Sequence[str | sa.ColumnElement[Any]]) -> None:
    parked = sa.text(f"status = '{PARKED}'")
    op.create_index(
        name, "outbox", columns, postgresql_where=parked, sqlite_where=parked, if_not_exists=True
    )
