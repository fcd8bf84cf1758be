"""The inbox's own statements (``InboxStatements``): a message's key inserted first in its
handler's transaction, failed attempts counted in transactions of their own, old keys purged
in bounded chunks.

The key goes in with the database's own "insert or ignore" (``ON CONFLICT DO NOTHING``,
``INSERT IGNORE``, ``INSERT OR IGNORE``), never a look then an insert: a second delivery of a
message being processed (redelivered to another consumer of the same name after a lost
connection) waits on the first one's uncommitted key, and finds it once that commits. Its
row count says which it was. ``INSERT IGNORE`` would also truncate a value too long for its
column; ``relay.inbox`` refuses such ids before they get here.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
import sqlalchemy as sa

from relay.constants import LAST_ERROR_MAX_CHARS
from relay.db.clock import database_time
from relay.db.dialects import of
from relay.db.schema import inbox_attempts, inbox_received
from relay.db.statements import run_delete

# The reason counted for a run that died inside its handler.
CRASHED = "the consumer stopped inside the handler"
# The message's commit, and PostgreSQL's status for one that committed.
COMMIT = "COMMIT"
# Where a connection's info keeps what its last key's insert returned (``add_key``).
_KEY_TOKEN = "relay_inbox_key_token"


class Failures(NamedTuple):
    """What the inbox counted against a message: for its dead letter's headers."""

    attempts: int
    last_error: str | None
    first_failed_at: datetime | None
    last_failed_at: datetime | None


class InboxStatements:
    """The inbox's own statements for one consumer, each a function of a connection in the
    transaction its caller opened: the blocking store runs them on its connections, the
    asyncio store (``relay.db.inbox_async``) through ``AsyncConnection.run_sync``, so one
    piece of SQL serves both."""

    def __init__(self, dialect: sa.Dialect, consumer: str) -> None:
        self.consumer = consumer
        self.database = of(dialect)
        # The key's insert; public for bench.inbox, which measures it alone.
        self.insert_key = self.database.insert_or_ignore(inbox_received).values(
            consumer=sa.bindparam("consumer"), message_id=sa.bindparam("message_id")
        )
        token = self.database.key_token
        returned: sa.ColumnClause[Any] = sa.literal_column(token or "1")
        returning: sa.ClauseElement = self.insert_key.returning(returned)
        # The key's insert as psycopg runs it (``add_key``): its row says it went in, and
        # which transaction wrote it (``Dialect.key_token``).
        self.key_sql = str(returning.compile(dialect=dialect))
        self._count_attempt = _upsert_attempt(dialect)
        self._mark_run = self.database.insert_or_ignore(inbox_attempts).values(
            consumer=sa.bindparam("consumer"), message_id=sa.bindparam("message_id"), attempts=0
        )
        looks: list[sa.ColumnClause[Any]] = [sa.literal_column(self.database.key_look)]
        looks += [sa.literal_column(token)] if token else []
        looked = inbox_received
        if self.database.key_schema is not None:
            looked = inbox_received.to_metadata(sa.MetaData(), schema=self.database.key_schema)
        self._key_there: sa.Select[Any] = sa.select(*looks).where(
            looked.c.consumer == sa.bindparam("consumer"),
            looked.c.message_id == sa.bindparam("message_id"),
        )
        self.key_there_sql = str(self._key_there.compile(dialect=dialect))

    def error_facts(self, error: BaseException) -> list[str] | None:
        """What the driver's ``error`` says that names no value (``Dialect.error_facts``)."""
        return self.database.error_facts(error)

    def key(self, message_id: str) -> dict[str, str]:
        """A message's key as the statements here bind it (see ``_of``)."""
        return {
            "consumer": self.consumer,
            "message_id": message_id,
            "of_consumer": self.consumer,
            "of_message_id": message_id,
        }

    def key_row(self, message_id: str) -> dict[str, str]:
        """The key's row, as ``insert_key`` binds it."""
        return {"consumer": self.consumer, "message_id": message_id}

    def add_key(self, conn: sa.Connection, message_id: str) -> bool:
        """Insert the message's key, the transaction's first statement; False when it was
        there (processed before). On psycopg's blocking connection, straight through the
        driver (the statement compiled once): a statement through SQLAlchemy costs about
        80 us of Python more, a tenth of a delivery (bench.inbox). SQLAlchemy's transaction
        is the one psycopg begins here, and commits or rolls back as usual. The transaction
        that inserted it is remembered (``inserted``), or marked (``Dialect.mark_key``), for
        ``holds_key``."""
        key = self.key_row(message_id)
        cursor = _through_psycopg(conn, self.key_sql, key)
        if cursor is not None:
            return self.inserted(conn, cursor.fetchone())
        inserted = conn.execute(
            self.insert_key, key, execution_options={"preserve_rowcount": True}
        ).rowcount
        if inserted:
            self.database.mark_key(conn)
        return bool(inserted)

    def inserted(self, conn: sa.Connection, row: Any) -> bool:
        """Whether ``key_sql`` inserted the key (``row``, what it returned; None: it was
        there), the transaction that wrote the row (``Dialect.key_token``) remembered in the
        connection's info for ``holds_key``."""
        conn.info[_KEY_TOKEN] = None if row is None else row[0]
        return row is not None

    def holds_key(self, conn: sa.Connection, message_id: str) -> bool:
        """Whether the key this run inserted (``add_key``) is in ``conn``'s transaction, as
        the handler leaves it: in the transaction that inserted it, or committed by that
        transaction (a handler that committed its work through a door of its own: nothing is
        lost). Not there: the transaction was rolled back past ``Transaction``, and this one
        is another; and the key committed by another transaction (a second consumer's,
        given the message once the first one's key went with its rollback) is not this
        run's (``Dialect.key_token``, ``Dialect.key_marked``): its handler's work would be
        committed twice. Straight through psycopg, as ``add_key``: a look per delivery. On
        PostgreSQL it sets the transaction's commit durable again (``Dialect.key_look``)."""
        marked = self.database.key_marked(conn)
        if marked is not None:
            return marked
        row = self._look(conn, message_id)
        if row is None:
            return False
        return self.database.key_token is None or row[-1] == conn.info.get(_KEY_TOKEN)

    def _look(self, conn: sa.Connection, message_id: str) -> Any:
        """The key's row as ``conn``'s transaction sees it, or None."""
        key = self.key_row(message_id)
        cursor = _through_psycopg(conn, self.key_there_sql, key)
        if cursor is not None:
            return cursor.fetchone()
        return conn.execute(self._key_there, key).first()

    def commit(self, conn: sa.Connection) -> bool:
        """Commit the message's transaction: whether it committed, not rolled back instead
        (PostgreSQL answers ROLLBACK to the COMMIT of a transaction a statement's error
        aborted, raising nothing: the message, acked, would be lost). Its status read
        straight through psycopg; SQLAlchemy's transaction closed after (psycopg sends
        nothing more, its transaction over)."""
        sql = self.commit_sql(conn, conn.connection.driver_connection)
        cursor = _through_psycopg(conn, sql, None)
        conn.commit()
        return cursor is None or last_status(cursor) == COMMIT

    def commit_sql(self, conn: sa.Connection, driver: Any) -> str:
        """The message's COMMIT as sent on ``driver``, ``conn``'s (``Dialect.commit_sql``)."""
        return self.database.commit_sql(driver, conn.info.get(_KEY_TOKEN))

    def key_committed(self, conn: sa.Connection, message_id: str) -> bool:
        """Whether the message's key is committed, seen from a transaction of its own."""
        return self._look(conn, message_id) is not None

    def count_attempt(self, conn: sa.Connection, message_id: str, error: str) -> int:
        """One more failed attempt at the message, its run over. Returns how many attempts
        there have been."""
        key = self.key(message_id)
        conn.execute(self._count_attempt, {**key, "last_error": error[:LAST_ERROR_MAX_CHARS]})
        return int(conn.scalar(_attempts_of(), key) or 0)

    def start_run(self, conn: sa.Connection, message_id: str) -> int | None:
        """Mark a run of the message's handler, for a delivery that came again: None when the
        message was processed (its key is there: its ack was lost), nothing marked or counted;
        else if the last such mark is still there, that run died inside the handler, and it
        is counted now as a failed attempt. Returns the attempts counted so far (this run not
        among them). Only deliveries that came again are marked: a first delivery costs
        nothing more, and a consumer dying in its handler is counted from its second
        delivery on."""
        if self.key_committed(conn, message_id):
            return None
        key = self.key(message_id)
        attempt = inbox_attempts.c
        conn.execute(self._mark_run, key)
        crashed = (
            sa.update(inbox_attempts)
            .where(*_of(), attempt.running)
            .values(
                attempts=attempt.attempts + 1,
                last_error=CRASHED,
                updated_at=database_time(),
                first_failed_at=sa.func.coalesce(attempt.first_failed_at, database_time()),
            )
        )
        if conn.execute(crashed, key).rowcount == 0:
            conn.execute(sa.update(inbox_attempts).where(*_of()).values(running=True), key)
        return int(conn.scalar(_attempts_of(), key) or 0)

    def end_run(self, conn: sa.Connection, message_id: str) -> None:
        """The run marked by ``start_run`` ended without dying inside the handler: committed
        with its key, a duplicate, or the database failed around it (nothing to count)."""
        conn.execute(
            sa.update(inbox_attempts).where(*_of(), inbox_attempts.c.running).values(running=False),
            self.key(message_id),
        )

    def forget_attempts(self, conn: sa.Connection, message_ids: Sequence[str]) -> None:
        """Delete the messages' failed attempts (``relay inbox requeue``: their cause fixed,
        they get their whole retry schedule again)."""
        conn.execute(
            sa.delete(inbox_attempts).where(*_of()), [self.key(key) for key in message_ids]
        )

    def failures(self, conn: sa.Connection, message_id: str) -> Failures | None:
        """The failures counted for the message, or None."""
        attempt = inbox_attempts.c
        columns = (
            attempt.attempts,
            attempt.last_error,
            attempt.first_failed_at,
            attempt.updated_at,
        )
        row = conn.execute(sa.select(*columns).where(*_of()), self.key(message_id)).first()
        return None if row is None else Failures(*row)

    def attempts(self, conn: sa.Connection, message_id: str) -> int:
        """Failed attempts counted for the message so far."""
        return int(conn.scalar(_attempts_of(), self.key(message_id)) or 0)

    def purge_one(self, conn: sa.Connection, older_than: float, chunk: int) -> int:
        """Delete at most ``chunk`` of this consumer's keys, then of its attempts, older than
        ``older_than`` seconds (by the database's clock), oldest first; returns how many (fewer
        than ``chunk``: nothing older is left)."""
        deleted = 0
        for table, stamp in (
            (inbox_received, inbox_received.c.received_at),
            (inbox_attempts, inbox_attempts.c.updated_at),
        ):
            old = sa.and_(table.c.consumer == self.consumer, stamp < database_time(-older_than))
            delete = of(conn).delete_chunk(table, table.c.message_id, old, chunk - deleted, stamp)
            deleted += run_delete(delete, conn)
            if deleted >= chunk:
                break
        return deleted

    @staticmethod
    def durability(conn: sa.Connection) -> str | None:
        """Why a commit here may not survive a crash of the database's host, where the inbox
        cannot set it per session, or None. PostgreSQL's and SQLite's sessions commit
        durably whatever the server's default (``relay.db.engine``); MariaDB's flush is the
        server's alone."""
        return of(conn).durability_problem(conn)

    @staticmethod
    def ping(conn: sa.Connection) -> None:
        conn.execute(sa.text("SELECT 1"))


def last_status(cursor: Any) -> str | None:
    """The status of the last statement a psycopg cursor ran (a text of several)."""
    while cursor.nextset():
        pass
    return cursor.statusmessage  # type: ignore[no-any-return]


def inserted_token(conn: sa.Connection) -> Any:
    """What the key's insert on ``conn`` returned (``Dialect.key_token``), or None."""
    return conn.info.get(_KEY_TOKEN)


def _through_psycopg(
    conn: sa.Connection, sql: str, parameters: dict[str, str] | None
) -> psycopg.Cursor[Any] | None:
    """``sql`` run straight through psycopg's blocking connection under ``conn``: its cursor;
    None on another driver. Its error as SQLAlchemy's would be, the connection invalidated
    when the error says it was lost (``lost``)."""
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        return None
    try:
        return driver.execute(sql, parameters)
    except psycopg.Error as exc:
        error: Any = exc  # psycopg's, which SQLAlchemy's dialect knows by its own name
        gone = conn.dialect.is_disconnect(error, conn.connection.dbapi_connection, None)
        if gone:
            conn.invalidate(exc)
        raise sa.exc.DBAPIError.instance(
            sql, parameters, exc, psycopg.Error, connection_invalidated=gone
        ) from exc


def _of() -> tuple[sa.ColumnElement[bool], ...]:
    """A message's row of ``inbox_attempts``: its key bound as ``of_consumer`` and
    ``of_message_id`` (an UPDATE reserves the columns' own names for its SET clause)."""
    return (
        inbox_attempts.c.consumer == sa.bindparam("of_consumer"),
        inbox_attempts.c.message_id == sa.bindparam("of_message_id"),
    )


def _attempts_of() -> sa.Select[tuple[int]]:
    return sa.select(inbox_attempts.c.attempts).where(*_of())


def _upsert_attempt(dialect: sa.Dialect) -> sa.Insert:
    """A failed attempt's row inserted with a count of 1, or its count raised by one."""
    values = {
        "consumer": sa.bindparam("consumer"),
        "message_id": sa.bindparam("message_id"),
        "attempts": 1,
        "last_error": sa.bindparam("last_error"),
        "updated_at": database_time(),
        "first_failed_at": database_time(),
        "running": False,
    }
    raised = {
        "attempts": inbox_attempts.c.attempts + 1,
        "last_error": sa.bindparam("last_error"),
        "updated_at": database_time(),
        "first_failed_at": sa.func.coalesce(inbox_attempts.c.first_failed_at, database_time()),
        "running": False,
    }
    return of(dialect).upsert(inbox_attempts, values, ["consumer", "message_id"], raised)
