"""The sent log writes no WAL on PostgreSQL: unlogged, with a logged journal it is rebuilt from.

- PostgreSQL: the sent log becomes UNLOGGED (its key index's page images made an ack cost
  about nine times the writer's INSERT in WAL once the log was days old), and each ack's
  entries are also written, as one row, to ``outbox_sent_journal``, logged and appended in
  time order (``relay.db.schema``). The entries logged so far are copied into the journal
  first, in rows of at most a thousand. A crash or a failover empties the log; relays then
  claim nothing until one of them has copied the journal back (``relay.db.sentlog``). The
  log's sent-time index goes: the journal's time order serves the purge and ``relay status``,
  and a rebuild into a log with its key index alone is four times as fast.
- Every database: ``outbox_sent_state``, whose one row says the log is complete (unlogged on
  PostgreSQL, so that a crash empties it with the log); claims need it. The log is renamed
  ``outbox_sent_log``: a relay of the release before that acks after this migration (one
  that was cut off from the database past its lease while the migration ran, or any beside
  ``--force``) would log its entries without the journal, to be lost at the next crash and
  never purged; under the new name its ack fails and rolls back, and its rows are published
  again by this release's relays (at least once, their message ids unchanged). On MySQL and
  MariaDB a grant on the table's old name does not follow it: grant the new one.
- The schema's least protocol becomes 3: relays before it claim without asking whether the
  log is complete and ack without the journal, so a crash would make them publish re-written
  ids again. ``relay migrate`` refuses while they hold buckets; those still running then
  give their buckets up and exit.

A publication that lists the log (a change-data-capture feed) stops the migration before it
changes anything: PostgreSQL makes no published table unlogged; the error says how to take
the log out.

Stop the relays of the release before (the migration refuses otherwise): on PostgreSQL the
log is rewritten unlogged and copied into the journal, which locks it for a while (about a
minute per ten million entries here).

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-28
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from relay.db.columns import UTCDateTime
from relay.db.schema import SENT_LOG
from relay.errors import MigrationRefusedError

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``):
# relays of protocol 2 claim without asking whether the sent log is complete.
least_protocol = 3
_RELEASE = "the release of migration 0015"
# ``relay.db.buckets.EVERY_PROTOCOL``, as migration 0013 left the row (0014 leaves it as it is).
_BEFORE = (1, "any release")
# The log's name from this revision on (``relay.db.schema.outbox_sent``).
_LOG = "outbox_sent_log"
# A journal row holds at most as many entries as an ack statement (``IDS_PER_STATEMENT``).
_JOURNAL_ROW_ENTRIES = 1000


def upgrade() -> None:
    postgresql_ = op.get_bind().dialect.name == "postgresql"
    if postgresql_:
        _unpublished("outbox_sent")
    op.rename_table("outbox_sent", _LOG)
    if postgresql_:
        op.execute(f"ALTER INDEX outbox_sent_pkey RENAME TO {_LOG}_pkey")
        op.drop_index("outbox_sent_time_idx", table_name=_LOG)
        op.execute(f"ALTER TABLE {_LOG} SET UNLOGGED")
        op.create_table(
            "outbox_sent_journal",
            sa.Column("sent_at", UTCDateTime(), primary_key=True),
            sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=False),
            sa.Column("message_keys", postgresql.ARRAY(sa.Uuid(as_uuid=False)), nullable=False),
            sa.Column("ids", postgresql.ARRAY(sa.BigInteger()), nullable=False),
            sa.Column("created_at", postgresql.ARRAY(sa.DateTime(timezone=True)), nullable=False),
        )
        # In time order, so that the purge frees whole pages from the first one on.
        op.execute(
            "INSERT INTO outbox_sent_journal (sent_at, id, message_keys, ids, created_at) "
            "SELECT sent_at, min(id), array_agg(key ORDER BY id), array_agg(id ORDER BY id), "
            f"array_agg(created_at ORDER BY id) FROM {_LOG} "
            f"GROUP BY sent_at, div(id, {_JOURNAL_ROW_ENTRIES}) ORDER BY 1, 2"
        )
    state = op.create_table(
        "outbox_sent_state",
        sa.Column("log", sa.SmallInteger(), primary_key=True, autoincrement=False),
        sa.Column("complete", sa.Boolean(), nullable=False),
        prefixes=["UNLOGGED"] if postgresql_ else [],
    )
    op.bulk_insert(state, [{"log": SENT_LOG, "complete": True}])
    _least_protocol(least_protocol, _RELEASE)


def downgrade() -> None:
    _least_protocol(*_BEFORE)
    op.drop_table("outbox_sent_state")
    if op.get_bind().dialect.name == "postgresql":
        # A log a crash emptied and no relay rebuilt is rebuilt here first: the releases
        # before read only the log. Of a key journaled twice, its latest entry, as a relay's
        # rebuild keeps (``relay.db.sentlog``): the older one's purge comes first.
        op.execute(
            f"INSERT INTO {_LOG} (key, id, created_at, sent_at) "
            "SELECT DISTINCT ON (entry.key) entry.key, entry.id, entry.created_at, j.sent_at "
            "FROM outbox_sent_journal j, "
            "unnest(j.message_keys, j.ids, j.created_at) AS entry(key, id, created_at) "
            "ORDER BY entry.key, j.sent_at DESC ON CONFLICT DO NOTHING"
        )
        op.drop_table("outbox_sent_journal")
        op.execute(f"ALTER TABLE {_LOG} SET LOGGED")
        op.create_index("outbox_sent_time_idx", _LOG, ["sent_at"])
        op.execute(f"ALTER INDEX {_LOG}_pkey RENAME TO outbox_sent_pkey")
    op.rename_table(_LOG, "outbox_sent")


def _unpublished(log: str) -> None:
    """Refuse, before anything changes, while a publication lists the log: PostgreSQL makes
    no table of a publication unlogged (a change-data-capture feed of the outbox's tables)."""
    listed = sa.text(
        "SELECT p.pubname FROM pg_publication_rel r JOIN pg_publication p ON p.oid = r.prpubid "
        "WHERE r.prrelid = CAST(:log AS regclass) ORDER BY 1"
    )
    bind = op.get_bind()
    names = list(bind.execute(listed, {"log": log}).scalars())
    if names:
        quoted = map(bind.dialect.identifier_preparer.quote, names)
        drops = " ".join(f"ALTER PUBLICATION {name} DROP TABLE {log};" for name in quoted)
        raise MigrationRefusedError(
            f"migration 0015 makes the sent log {log} unlogged, and PostgreSQL makes no "
            f"table of a publication unlogged: {log} is in {', '.join(names)}. Take it out "
            f"({drops}) and migrate again; each ack's entries are then in the journal, "
            "outbox_sent_journal, for a publication to carry. Nothing was changed"
        )


def _least_protocol(protocol: int, release: str) -> None:
    row = sa.table("outbox_protocol", sa.column("least_protocol"), sa.column("least_release"))
    op.execute(sa.update(row).values(least_protocol=protocol, least_release=release))
