"""Ids never handed out twice; a sent log whose time index stays narrow.

- SQLite: the outbox's id becomes ``AUTOINCREMENT``. As a plain rowid, the id of the highest
  row was given again once that row was deleted (an ack deletes it, by default): a stale ack,
  or a settle retried after a commit the relay did not see, could then delete a newer row that
  was never published. The table is copied into one whose id is ``AUTOINCREMENT``, and its
  counter starts above every id the outbox and the sent log have seen. PostgreSQL's sequence
  and InnoDB's counter (persisted since MariaDB 10.2.4 and MySQL 8.0) never went back.
- PostgreSQL: the sent log's time index becomes a B-tree. A BRIN index assumes the log's
  physical order is its time order; once the purge freed old pages and new entries landed in
  them, its ranges spanned every time, and the purge and ``relay status`` read most of the log.
  (MySQL's and SQLite's were B-trees already.)

Stop the relays while this runs: the copy (SQLite) and the index build (PostgreSQL) lock the
table they work on.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None
# The least protocol of the relays that may run beside this revision (``relay migrate``).
least_protocol = None


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        with op.batch_alter_table(
            "outbox", recreate="always", table_kwargs={"sqlite_autoincrement": True}
        ):
            pass
        op.execute(
            "INSERT INTO sqlite_sequence (name, seq) SELECT 'outbox', max(coalesce("
            "(SELECT max(id) FROM outbox), 0), coalesce((SELECT max(id) FROM outbox_sent), 0)) "
            "WHERE NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'outbox')"
        )
        op.execute(
            "UPDATE sqlite_sequence SET seq = max(seq, coalesce("
            "(SELECT max(id) FROM outbox_sent), 0)) WHERE name = 'outbox'"
        )
    elif dialect == "postgresql":
        op.drop_index("outbox_sent_time_idx", table_name="outbox_sent")
        op.create_index("outbox_sent_time_idx", "outbox_sent", ["sent_at"])


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "sqlite":
        with op.batch_alter_table(
            "outbox", recreate="always", table_kwargs={"sqlite_autoincrement": False}
        ):
            pass
    elif dialect == "postgresql":
        op.drop_index("outbox_sent_time_idx", table_name="outbox_sent")
        op.create_index("outbox_sent_time_idx", "outbox_sent", ["sent_at"], postgresql_using="brin")
