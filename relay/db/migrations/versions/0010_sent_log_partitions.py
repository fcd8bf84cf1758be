"""The sent log in two partitions on PostgreSQL, emptied whole in turn (``relay.db.sentlog``).

- PostgreSQL: ``outbox_sent`` becomes a table partitioned by its new ``slot`` column, with the
  partitions ``outbox_sent_0`` and ``outbox_sent_1``; the entries logged so far go to slot 0,
  which the acks log into next (``outbox_counters``' ``sent_slot`` row). Its primary key
  becomes (key, slot): a partitioned table's unique keys hold its partition key.
- MySQL and SQLite: the same column and key, every entry in slot 0; their retention still
  deletes old entries in chunks.

Stop the relays while this runs: the log is copied into the new table (about a second per
million entries here), and a relay of an earlier version would log into the old one.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op

from relay.db.schema import ROW_ID, SENT_KEY, SENT_PARTITIONS, SENT_SLOT, UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_COLUMNS = ("key", "id", "created_at", "sent_at")


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    _set_aside("outbox_sent_0009", postgresql)
    op.create_table(
        "outbox_sent",
        sa.Column("key", SENT_KEY, primary_key=True),
        sa.Column("slot", sa.SmallInteger(), primary_key=True, server_default="0"),
        sa.Column("id", ROW_ID, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime(), nullable=False),
        postgresql_partition_by="LIST (slot)",  # read on PostgreSQL only
    )
    if postgresql:
        for slot, partition in enumerate(SENT_PARTITIONS):
            op.execute(f"CREATE TABLE {partition} PARTITION OF outbox_sent FOR VALUES IN ({slot})")
    _copy("outbox_sent_0009", "outbox_sent")
    op.create_index("outbox_sent_time_idx", "outbox_sent", ["sent_at"])
    counters = sa.table("outbox_counters", sa.column("name"), sa.column("value"))
    op.bulk_insert(counters, [{"name": SENT_SLOT, "value": 0}])


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    counters = sa.table("outbox_counters", sa.column("name"))
    op.execute(sa.delete(counters).where(counters.c.name == SENT_SLOT))
    _set_aside("outbox_sent_0010", postgresql)
    op.create_table(
        "outbox_sent",
        sa.Column("key", SENT_KEY, primary_key=True),
        sa.Column("id", ROW_ID, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime(), nullable=False),
    )
    # An id logged in both partitions (a rotation apart) keeps one entry: its first.
    columns = ", ".join(_COLUMNS)
    if postgresql:
        op.execute(
            f"INSERT INTO outbox_sent ({columns}) SELECT DISTINCT ON (key) {columns} "
            "FROM outbox_sent_0010 ORDER BY key, sent_at"
        )
    else:
        old = sa.table("outbox_sent_0010", *map(sa.column, _COLUMNS))
        new = sa.table("outbox_sent", *map(sa.column, _COLUMNS))
        op.execute(sa.insert(new).from_select(_COLUMNS, sa.select(*old.c)))
    op.drop_table("outbox_sent_0010")  # on PostgreSQL its partitions with it
    op.create_index("outbox_sent_time_idx", "outbox_sent", ["sent_at"])


def _set_aside(name: str, postgresql: bool) -> None:
    """The sent log renamed ``name``, without the names its replacement takes (index names
    are the schema's on PostgreSQL and SQLite)."""
    op.drop_index("outbox_sent_time_idx", table_name="outbox_sent")
    op.rename_table("outbox_sent", name)
    if postgresql:
        op.execute(f"ALTER INDEX outbox_sent_pkey RENAME TO {name}_pkey")


def _copy(source: str, target: str) -> None:
    """Every entry of ``source`` into ``target``'s slot 0, then ``source`` dropped."""
    old = sa.table(source, *map(sa.column, _COLUMNS))
    new = sa.table(target, *map(sa.column, (*_COLUMNS, "slot")))
    entries = sa.select(*(old.c[c] for c in _COLUMNS), sa.literal(0))
    op.execute(sa.insert(new).from_select([*_COLUMNS, "slot"], entries))
    op.drop_table(source)
