"""PostgreSQL's part for the inbox (``relay.db.dialects.inbox``): how its guard reads a
handler's SQL, and how it tells what a handler did to the message's transaction and session
past the guard."""

from __future__ import annotations

from typing import Any, ClassVar

import psycopg
import sqlalchemy as sa

from relay.db.dialects.inbox import InboxDialect
from relay.db.sqltext import Lexicon

# What a session holds that outlives its transactions and the inbox's sessions never hold
# (``PostgreSQLInbox.session_left``): a statement a PREPARE made (SQLAlchemy's and psycopg's
# are the protocol's), a temporary object, a WITH HOLD cursor, a LISTEN, an advisory lock, a
# role; then every setting reset to the session's start (the inbox's own are the
# connection's options, which stay): one made for the session through a function or a
# block. Looking costs 0.8 ms of the server's time (pg_settings, a row in 400), the reset
# microseconds.
_SESSION_LEFT = """
SELECT 'the prepared statement ' || name FROM pg_prepared_statements WHERE from_sql
UNION ALL SELECT 'the temporary ' || relname FROM pg_class
  WHERE relnamespace = pg_my_temp_schema()
UNION ALL SELECT 'the cursor ' || name FROM pg_cursors
UNION ALL SELECT 'a LISTEN' FROM pg_listening_channels()
UNION ALL SELECT 'an advisory lock' FROM pg_locks
  WHERE locktype = 'advisory' AND pid = pg_backend_pid()
UNION ALL SELECT 'the role ' || current_user WHERE current_user <> session_user
LIMIT 1;
RESET ALL
"""
# The key's row's token (``key_token``): the transaction that wrote it, and its table's oid,
# a space between.
_TOKEN = "xmin::text || ' ' || tableoid::text"
# The message's commit, in one message with a check that the key's transaction is still
# this one, or has committed (``PostgreSQLInbox.commit_sql``): a thread or a task the
# handler left running, rolling back through the driver between the inbox's look at its key
# and its COMMIT, had that COMMIT begin and commit an empty transaction, and the message
# acked without its work (an outside review). The check fails, and the COMMIT after it in
# the same message is skipped, when the key's transaction was rolled back. A transaction's
# id is an xmin's low 32 bits; its full id is the nearest before the snapshot's end. The
# error's text depends on the session, so that the planner cannot fold the failing branch
# into every commit's plan. The key's transaction committed already (the handler's commit
# through the driver) may have committed without a flush (its ``synchronous_commit`` set off):
# the look's transaction then writes a record of its own (a transactional logical message,
# which any role may write, and whose decoding is a consumer's of the prefix alone), so that
# its COMMIT, made durable by the look, flushes the log past the key's commit before the ack
# (an outside review lost such a message in a crash after its ack).
_CHECKED_COMMIT = """\
SELECT CASE
  WHEN pg_current_xact_id_if_assigned()::text::bigint % 4294967296 = {xid} THEN 1
  WHEN pg_xact_status((SELECT CASE WHEN whole >= ends THEN whole - 4294967296 ELSE whole END
       FROM (SELECT ends / 4294967296 * 4294967296 + {xid} AS whole, ends
             FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS ends) e) f
     )::text::xid8) = 'committed'
    THEN 1 + 0 * length(pg_logical_emit_message(true, 'outbox-relay', 'flush')::text)
  ELSE ('the message''s transaction was rolled back before the inbox''s commit'
        || left(pg_backend_pid()::text, 0))::int
END; COMMIT"""
# Whether a session is still in the transaction a key's token names
# (``PostgreSQLInbox.holds_transaction``): a transaction holds the lock on its own id until
# it ends (or an error aborts it: ``went_on`` tells that one first), and any session sees it.
_HOLDS_TRANSACTION = sa.text(
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = :backend "
    "AND locktype = 'transactionid' AND transactionid::text = split_part(:token, ' ', 1))"
)


class PostgreSQLInbox(InboxDialect):
    """The inbox's part of ``relay.db.dialects.postgresql.PostgreSQL``."""

    sql_lexicon: ClassVar[Lexicon] = Lexicon(
        nested_comments=True, dollar_quotes=True, unicode_names=True
    )
    # A handler may set ``synchronous_commit`` off for its transaction in any spelling (``SET
    # LOCAL``, ``set_config(..., true)``, a ``DO`` block): an acked message would then be lost
    # in a crash right after. Set on again at the inbox's look, the transaction's last setting
    # wins (the guard lets nothing of the handler's run after it).
    key_look: ClassVar[str] = "set_config('synchronous_commit', 'on', true)"
    # The transaction that wrote the key's row, as the insert returns it and the look reads
    # it; and the table it is in: a temporary table of the inbox's name, which comes first on
    # every search path, made in the handler's transaction with the key's row copied in (its
    # xmin the same) and the real row deleted, was the look's (an outside review).
    key_token: ClassVar[str | None] = _TOKEN

    def commit_sql(self, driver: Any, token: Any) -> str:
        xid = str(token or "").partition(" ")[0]
        aborted = driver.info.transaction_status == psycopg.pq.TransactionStatus.INERROR
        if aborted or not xid.isdigit():
            return "COMMIT"  # answered ROLLBACK, which the inbox reads
        return _CHECKED_COMMIT.format(xid=int(xid))

    def changes_session(self, words: tuple[str, ...]) -> bool:
        # SET LOCAL and SET CONSTRAINTS last the transaction; SET, RESET and DISCARD the
        # session.
        if words[0] in ("RESET", "DISCARD"):
            return True
        return words[0] == "SET" and words[1:2] not in (("LOCAL",), ("CONSTRAINTS",))

    def session_changed(self, driver: Any) -> bool:
        return bool(getattr(driver, "autocommit", False))

    def outside_transaction(self, driver: Any) -> bool:
        # psycopg would begin another transaction, which the inbox would commit with the
        # rest, or the driver commit: a statement after the message's transaction ended is
        # refused here as on SQLite, so that what went on after is the driver's alone.
        return bool(driver.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)

    def went_on(self, conn: sa.Connection) -> bool | None:
        # Nothing here traces the session's statements: a transaction ended is taken for one
        # that went on (through the driver: the guard refuses the rest), but one an error
        # aborted, which is the message's unless the driver began another (PostgreSQL has
        # released an aborted transaction's locks: nothing tells the two apart).
        driver: Any = conn.connection.driver_connection
        status = driver.info.transaction_status
        if status == psycopg.pq.TransactionStatus.IDLE:
            return True
        return False if status == psycopg.pq.TransactionStatus.INERROR else None

    def holds_transaction(self, conn: sa.Connection, backend: Any, token: Any) -> bool:
        # The transaction's own id, not a lock on the inbox's table: a transaction the
        # driver began after the message's ended, reading that table, held one too, and was
        # taken for the message's (an outside review).
        return bool(conn.scalar(_HOLDS_TRANSACTION, {"backend": backend, "token": token}))

    def backend(self, driver: Any) -> Any:
        return driver.info.backend_pid

    def session_left(self, conn: sa.Connection) -> str | None:
        # In one round trip, the reset committed as it runs (the pool sets the connection's
        # isolation level back as it takes it in).
        conn.execution_options(isolation_level="AUTOCOMMIT")
        return conn.exec_driver_sql(_SESSION_LEFT).scalar()
