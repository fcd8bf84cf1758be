"""The sent log writes no WAL on PostgreSQL: a new log, unlogged, with a logged journal it is
rebuilt from, made beside the log of the releases before, which their relays go on using.

An expansion: nothing here changes a table a relay of the release before uses, nor takes a
lock it waits on, so they publish on while `relay migrate` runs, and after it, until the
protocol fence hands the outbox to this release's relays (protocol 3: they claim nothing
while relays of an older protocol hold buckets, ``relay.buckets``).

- Every database: ``outbox_sent_log``, the new log, empty; this release's acks log their
  keys there. On PostgreSQL it is UNLOGGED (the old log's key index's page images made an
  ack cost about nine times the writer's INSERT in WAL once the log was days old), with its
  key index alone, and each ack's entries also go, as one row, to ``outbox_sent_journal``,
  logged and appended in time order; a crash or a failover empties the log, and relays
  claim nothing until one of them has copied the journal back (``relay.db.sentlog``).
  The journal's entries are sealed, every few minutes, into runs in key order
  (``outbox_sent_runs``, ``outbox_sent_blocks``, logged), so that after a crash only the
  entries no run holds are copied back before claims go on (``relay.db.sentruns``).
  Elsewhere it is logged, with its sent-time index, as the old one.
- ``outbox_sent_state``, whose one row says the new log is complete (unlogged on
  PostgreSQL, so that a crash empties it with the log); claims need it. Complete here: the
  journal is empty.
- The old log, ``outbox_sent``, stays as it is: the relays of the release before write and
  probe it; this release's claims probe it beside the new log (an id acked by either
  release is dropped when written again), and its purge empties it over the horizon. A
  later release drops it once nothing in it is within any horizon.

The least protocol stays as it was: relays of the release before may run beside this
revision (they never publish beside this release's: the fence). The first relay of this
release to take the outbox over raises it to 3 (``relay.db.buckets.refresh``), so that no
relay of the release before takes it back. A downgrade lowers it again (as migration 0013
left it) and copies the new log's entries into the old one (of a key in both, the later
entry), for the releases before.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from relay.db.columns import ROW_ID, SENT_KEY, UTCDateTime
from relay.db.schema import SENT_LOG

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None
least_protocol = None
_LOG = "outbox_sent_log"
_ENTRY = ("key", "id", "created_at", "sent_at")


def upgrade() -> None:
    postgresql_ = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        _LOG,
        sa.Column("key", SENT_KEY, primary_key=True),
        sa.Column("id", ROW_ID, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime(), nullable=False),
        prefixes=["UNLOGGED"] if postgresql_ else [],
    )
    if postgresql_:
        op.create_table(
            "outbox_sent_journal",
            sa.Column("sent_at", UTCDateTime(), primary_key=True),
            sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("message_keys", postgresql.ARRAY(sa.Uuid(as_uuid=False)), nullable=False),
            sa.Column("ids", postgresql.ARRAY(sa.BigInteger()), nullable=False),
            sa.Column("created_at", postgresql.ARRAY(sa.DateTime(timezone=True)), nullable=False),
        )
        op.create_table(
            "outbox_sent_runs",
            sa.Column("run", sa.BigInteger(), sa.Identity(), primary_key=True),
            sa.Column("level", sa.SmallInteger(), nullable=False),
            sa.Column("first_at", UTCDateTime(), nullable=False),
            sa.Column("upto", UTCDateTime(), nullable=False),
            sa.Column("entries", sa.BigInteger(), nullable=False),
            sa.Column("building", sa.Boolean(), nullable=False, server_default=sa.false()),
            sa.Column("merged_into", sa.BigInteger()),
        )
        op.create_table(
            "outbox_sent_blocks",
            sa.Column("run", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("first_key", sa.Uuid(as_uuid=False), primary_key=True),
            sa.Column("message_keys", postgresql.ARRAY(sa.Uuid(as_uuid=False)), nullable=False),
            sa.Column("sent_at", postgresql.ARRAY(sa.DateTime(timezone=True)), nullable=False),
        )
    else:
        op.create_index(f"{_LOG}_time_idx", _LOG, ["sent_at"])
    state = op.create_table(
        "outbox_sent_state",
        sa.Column("log", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("complete", sa.Boolean(), nullable=False),
        sa.Column("recovering", sa.Boolean(), nullable=False, server_default=sa.false()),
        prefixes=["UNLOGGED"] if postgresql_ else [],
    )
    op.bulk_insert(state, [{"log": SENT_LOG, "complete": True, "recovering": False}])


def downgrade() -> None:
    """The new log's entries into the old one: of a key in both, the later entry (the older
    one's purge comes first). On PostgreSQL they are read from the journal, whole whether or
    not a crash emptied the log: of a key journaled twice, its latest entry, as a relay's
    rebuild keeps."""
    old = sa.table("outbox_sent", *(sa.column(name) for name in _ENTRY))
    source: sa.FromClause
    if op.get_bind().dialect.name == "postgresql":
        source = (
            sa.text(
                "SELECT DISTINCT ON (entry.key) entry.key, entry.id, entry.created_at, j.sent_at "
                "FROM outbox_sent_journal j, "
                "unnest(j.message_keys, j.ids, j.created_at) AS entry(key, id, created_at) "
                "ORDER BY entry.key, j.sent_at DESC"
            )
            .columns(*(sa.column(name) for name in _ENTRY))
            .subquery("source")
        )
    else:
        source = sa.table(_LOG, *(sa.column(name) for name in _ENTRY)).alias("source")
    newer = sa.exists().where(source.c.key == old.c.key, source.c.sent_at > old.c.sent_at)
    op.execute(sa.delete(old).where(newer))
    missing = ~sa.exists().where(old.c.key == source.c.key)
    entries = sa.select(*(source.c[name] for name in _ENTRY)).where(missing)
    op.execute(sa.insert(old).from_select(list(_ENTRY), entries))
    op.drop_table("outbox_sent_state")
    # The first relay of this release to take the outbox over raised it (protocol 3): the
    # releases before speak 2.
    protocol = sa.table("outbox_protocol", sa.column("least_protocol"), sa.column("least_release"))
    op.execute(sa.update(protocol).values(least_protocol=1, least_release="any release"))
    if op.get_bind().dialect.name == "postgresql":
        op.drop_table("outbox_sent_blocks")
        op.drop_table("outbox_sent_runs")
        op.drop_table("outbox_sent_journal")
    op.drop_table(_LOG)
