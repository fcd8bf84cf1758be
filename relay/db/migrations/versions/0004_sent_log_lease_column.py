"""Acked rows may leave the outbox: a sent log keeps their ids unique; leases in their own column.

- ``outbox.lease_until``: a claim sets it instead of ``next_attempt_at``. No index has it, and
  the outbox's pages are now filled to half (PostgreSQL's ``fillfactor``), so a claim is a
  HOT update: one heap record, no index entry.
- ``outbox_sent``: a message id's key, its row's id and its created and sent times, for
  every acked row that left the outbox. Rows sent before this migration stay as they are:
  the outbox's unique index keeps their ids until the purge deletes them, at the same age
  as it deletes log entries, so the dedupe horizon is the same for both.
- ``outbox_dedupe``: a trigger drops an inserted row whose message id is in the sent log, so
  that a re-run writer adds nothing, whatever it writes with (COPY, INSERT, Spark's JDBC
  writer). On PostgreSQL it runs once per statement over the statement's new rows, after
  the unique index has waited out a relay moving the same message id to the sent log (its
  query then sees the move committed); on SQLite, with one writer at a time, it skips the
  row before it is written. MySQL's triggers cannot skip a row: there the insert fails as
  if the id were still in the outbox (a duplicate key, error 1062), and the writers of this
  package leave such rows out themselves (``relay.db.sink``, ``relay.db.outbox``).
- Partial indexes for parked rows, for pending rows that failed before and for sent rows
  kept whole, so that ``relay status`` costs milliseconds at any backlog. A relayed row that
  never fails has no entry in any of them.
- Autovacuum of the outbox by a fixed count of dead rows instead of a fraction of the
  table: a 1M-row backlog otherwise let 200,000 dead versions pile up in front of the claim.

In-flight rows of relays of the old version (their lease in ``next_attempt_at``) are due when
that lease ends, as before: stop the old relays, migrate, start the new ones.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-24
"""

import sqlalchemy as sa
from alembic import op

from relay.db.columns import ROW_ID, SENT_KEY, UTCDateTime
from relay.db.schema import MYSQL_SKIPPED_INDEXES, index_columns

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None

# Dead row versions that start a vacuum of the outbox, whatever its size; see the docstring.
_OUTBOX_STORAGE = {
    "fillfactor": 50,
    "autovacuum_vacuum_scale_factor": 0,
    "autovacuum_vacuum_threshold": 10000,
    "autovacuum_vacuum_insert_scale_factor": 0,
    "autovacuum_vacuum_insert_threshold": 100000,
    "autovacuum_analyze_scale_factor": 0,
    "autovacuum_analyze_threshold": 10000,
}

_PARTIAL_INDEXES = (
    ("outbox_parked_idx", "id", "status = 'parked'"),
    ("outbox_retrying_idx", "exchange", "status = 'pending' AND attempts > 0"),
    ("outbox_sent_idx", "sent_at", "status = 'sent'"),
)

# The sent log is probed once per new row through its primary key (a scalar subquery runs per
# row; a join could be planned as a scan of the whole log, or of the outbox, per statement),
# and the outbox is touched only when a row was sent before (a re-run). The rows it drops are
# added up in a setting of the transaction, for writers that report how many rows they added
# (``relay.db.sink``): COPY counts the rows it wrote. It runs with the writer's rights (a
# writer then needs SELECT on the sent log and DELETE on the outbox): this release first made
# it SECURITY DEFINER, which ran code a writer could steer (its temporary schema) with the
# owner's rights; a downgrade from 0007 must not bring that back. Its search path is pinned.
_PG_DEDUPE = """
CREATE FUNCTION outbox_dedupe() RETURNS trigger LANGUAGE plpgsql
SECURITY INVOKER SET search_path FROM CURRENT AS $$
DECLARE
  again bigint[] := ARRAY(
    SELECT n.id FROM new_rows n
     WHERE (SELECT true FROM outbox_sent s WHERE s.key = md5(n.message_id)::uuid));
BEGIN
  IF cardinality(again) > 0 THEN
    DELETE FROM outbox WHERE id = ANY(again);
    PERFORM set_config('outbox.sent_before',
      (coalesce(nullif(current_setting('outbox.sent_before', true), ''), '0')::bigint
       + cardinality(again))::text, true);
  END IF;
  RETURN NULL;
END $$
"""
_PG_DEDUPE_TRIGGER = (
    "CREATE TRIGGER outbox_dedupe AFTER INSERT ON outbox REFERENCING NEW TABLE AS new_rows "
    "FOR EACH STATEMENT EXECUTE FUNCTION outbox_dedupe()"
)
_MYSQL_DEDUPE_TRIGGER = """
CREATE TRIGGER outbox_dedupe BEFORE INSERT ON outbox FOR EACH ROW
BEGIN
  IF EXISTS (SELECT 1 FROM outbox_sent WHERE `key` = unhex(md5(NEW.message_id))) THEN
    SIGNAL SQLSTATE '23000' SET MYSQL_ERRNO = 1062,
      MESSAGE_TEXT = 'outbox: this message_id was sent already (it is in outbox_sent)';
  END IF;
END
"""
_SQLITE_DEDUPE_TRIGGER = (
    "CREATE TRIGGER outbox_dedupe BEFORE INSERT ON outbox "
    "WHEN EXISTS (SELECT 1 FROM outbox_sent WHERE key = NEW.message_id) "
    "BEGIN SELECT RAISE(IGNORE); END"
)


def upgrade() -> None:
    dialect = op.get_bind().dialect
    postgresql = dialect.name == "postgresql"
    op.add_column("outbox", sa.Column("lease_until", UTCDateTime(), nullable=True))
    for name, column, where in _PARTIAL_INDEXES:
        if dialect.name == "mysql" and name in MYSQL_SKIPPED_INDEXES:
            continue
        op.create_index(
            name,
            "outbox",
            index_columns(dialect, [column]),
            postgresql_where=sa.text(where),
            sqlite_where=sa.text(where),
        )
    op.create_table(
        "outbox_sent",
        sa.Column("key", SENT_KEY, primary_key=True),
        sa.Column("id", ROW_ID, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime(), nullable=False),
    )
    op.create_index("outbox_sent_time_idx", "outbox_sent", ["sent_at"], postgresql_using="brin")
    if postgresql:
        storage = ", ".join(f"{name} = {value}" for name, value in _OUTBOX_STORAGE.items())
        op.execute(f"ALTER TABLE outbox SET ({storage})")
        op.execute(_PG_DEDUPE)
        op.execute(_PG_DEDUPE_TRIGGER)
    elif dialect.name == "mysql":
        op.execute(_MYSQL_DEDUPE_TRIGGER)
    else:
        op.execute(_SQLITE_DEDUPE_TRIGGER)


def downgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.execute("DROP TRIGGER outbox_dedupe" + (" ON outbox" if postgresql else ""))
    if postgresql:
        op.execute("DROP FUNCTION outbox_dedupe()")
        op.execute(f"ALTER TABLE outbox RESET ({', '.join(_OUTBOX_STORAGE)})")
    op.drop_index("outbox_sent_time_idx", table_name="outbox_sent")
    op.drop_table("outbox_sent")
    for name, _, _ in _PARTIAL_INDEXES:
        if op.get_bind().dialect.name == "mysql" and name in MYSQL_SKIPPED_INDEXES:
            continue
        op.drop_index(name, table_name="outbox")
    with op.batch_alter_table("outbox") as batch:
        batch.drop_column("lease_until")
