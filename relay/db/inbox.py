"""The inbox's database side: a message's key inserted first in its handler's transaction,
failed attempts counted in transactions of their own, old keys purged in bounded chunks.

The key goes in with the database's own "insert or ignore" (``ON CONFLICT DO NOTHING``,
``INSERT IGNORE``, ``INSERT OR IGNORE``), never a look then an insert: a second delivery of a
message being processed (redelivered to another consumer of the same name after a lost
connection) waits on the first one's uncommitted key, and finds it once that commits. Its
row count says which it was. ``INSERT IGNORE`` would also truncate a value too long for its
column; ``relay.inbox`` refuses such ids before they get here.
"""

from __future__ import annotations

import enum
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

import psycopg
import sqlalchemy as sa

from relay.constants import LAST_ERROR_MAX_CHARS
from relay.db.clock import database_time
from relay.db.dialects import of
from relay.db.engine import create_engine, db_errors, transaction
from relay.db.schema import inbox_attempts, inbox_received
from relay.db.statements import run_delete
from relay.errors import StoreError
from relay.redact import redact_url

T = TypeVar("T")

# Statements that would end or split the inbox's transaction, sent as SQL text.
_TRANSACTION_CONTROL = re.compile(
    r"\s*(COMMIT|ROLLBACK|ABORT|END|BEGIN|START\s+TRANSACTION|SAVEPOINT|RELEASE|SET\s+"
    r"(SESSION\s+)?(TRANSACTION|AUTOCOMMIT)|XA\s)",
    re.IGNORECASE,
)


# The reason counted for a run that died inside its handler.
CRASHED = "the consumer stopped inside the handler"


class Failures(NamedTuple):
    """What the inbox counted against a message: for its dead letter's headers."""

    attempts: int
    last_error: str | None
    first_failed_at: datetime | None
    last_failed_at: datetime | None


class TransactionEnded(StoreError):
    """A handler tried to end the inbox's transaction: a failed attempt, never a commit."""


def guarded(statement: Any) -> Any:
    """A handler's statement (SQL text made a ``TextClause``), refused when it would end or
    split the inbox's transaction."""
    if isinstance(statement, str):
        statement = sa.text(statement)
    if isinstance(statement, sa.TextClause) and _TRANSACTION_CONTROL.match(statement.text):
        raise TransactionEnded(
            "a handler may not end or split the inbox's transaction "
            f"({statement.text.split(None, 1)[0].upper()}): raise to roll back"
        )
    return statement


class Transaction:
    """What a handler writes with: the open transaction its message's key went into, which
    it can write and read in but not end. A handler that committed its part and then failed
    left the key committed (the retry was acked as a duplicate, the rest of the work never
    done); one that rolled back and returned was acked with no key and no effect. So there is
    no commit, rollback or close here, and a transaction statement sent as SQL text is
    refused; ``savepoint()`` rolls back a part of the handler's work on its own."""

    __slots__ = ("_conn",)

    def __init__(self, conn: sa.Connection) -> None:
        self._conn = conn

    @property
    def dialect(self) -> sa.Dialect:
        return self._conn.dialect

    def execute(
        self, statement: Any, parameters: Any = None, **options: Any
    ) -> sa.CursorResult[Any]:
        """``sa.Connection.execute``: a statement, its parameters (a dict, or a list of them
        for many rows), execution options as keywords."""
        return self._conn.execute(guarded(statement), parameters, execution_options=options)

    def scalar(self, statement: Any, parameters: Any = None) -> Any:
        return self.execute(statement, parameters).scalar()

    def scalars(self, statement: Any, parameters: Any = None) -> sa.ScalarResult[Any]:
        return self.execute(statement, parameters).scalars()

    @contextmanager
    def savepoint(self) -> Iterator[Transaction]:
        """A part of the handler's work that an exception inside rolls back alone (and goes
        on out of the block)."""
        with self._conn.begin_nested():
            yield self


class Outcome(enum.Enum):
    """What became of a handler's run in the transaction that holds its message's key."""

    DUPLICATE = "duplicate"  # the key was there: processed before, the handler not run
    DONE = "done"  # the handler returned, and its writes committed with the key
    FAILED = "failed"  # the handler raised: rolled back
    ENDED = "ended"  # the handler ended the transaction past ``Transaction``


class Ran(NamedTuple):
    """A handler's run (``InboxStore.run``): its outcome, the seconds from the key's insert to
    the commit (``DONE``), the exception (``FAILED``, ``ENDED``)."""

    outcome: Outcome
    seconds: float = 0.0
    error: Exception | None = None


class _Raised(Exception):
    """The handler raised (its exception the cause): out of the inbox's transaction."""


class InboxStatements:
    """The inbox's own statements for one consumer, each a function of a connection in the
    transaction its caller opened: the blocking store runs them on its connections, the
    asyncio store (``relay.db.inbox_async``) through ``AsyncConnection.run_sync``, so one
    piece of SQL serves both."""

    def __init__(self, dialect: sa.Dialect, consumer: str) -> None:
        self.consumer = consumer
        # The key's insert; public for bench.inbox, which measures it alone.
        self.insert_key = (
            of(dialect)
            .insert_or_ignore(inbox_received)
            .values(consumer=sa.bindparam("consumer"), message_id=sa.bindparam("message_id"))
        )
        returning: sa.ClauseElement = self.insert_key.returning(sa.literal_column("1"))
        # The key's insert as psycopg runs it (``add_key``): its row says it went in.
        self.key_sql = str(returning.compile(dialect=dialect))
        self._count_attempt = _upsert_attempt(dialect)
        self._mark_run = (
            of(dialect)
            .insert_or_ignore(inbox_attempts)
            .values(
                consumer=sa.bindparam("consumer"), message_id=sa.bindparam("message_id"), attempts=0
            )
        )

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
        is the one psycopg begins here, and commits or rolls back as usual."""
        key = self.key_row(message_id)
        driver = conn.connection.driver_connection
        if isinstance(driver, psycopg.Connection):
            try:
                return driver.execute(self.key_sql, key).fetchone() is not None
            except psycopg.Error as exc:
                raise sa.exc.DBAPIError.instance(self.key_sql, key, exc, psycopg.Error) from exc
        inserted = conn.execute(
            self.insert_key, key, execution_options={"preserve_rowcount": True}
        ).rowcount
        return bool(inserted)

    def count_attempt(self, conn: sa.Connection, message_id: str, error: str) -> int:
        """One more failed attempt at the message (its handler raised), its run over;
        returns how many there have been."""
        key = self.key(message_id)
        conn.execute(self._count_attempt, {**key, "last_error": error[:LAST_ERROR_MAX_CHARS]})
        return int(conn.scalar(_attempts_of(), key) or 0)

    def start_run(self, conn: sa.Connection, message_id: str) -> int:
        """Mark a run of the message's handler, for a delivery that came again: if the last
        such mark is still there, that run died inside the handler, and it is counted now
        as a failed attempt. Returns the attempts counted so far (this run not among them).
        Only deliveries that came again are marked: a first delivery costs nothing more, and
        a consumer dying in its handler is counted from its second delivery on."""
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
        """The run marked by ``start_run`` ended without the handler failing (the database
        failed around it): nothing to count."""
        conn.execute(
            sa.update(inbox_attempts).where(*_of()).values(running=False), self.key(message_id)
        )

    def forget(self, conn: sa.Connection, message_id: str) -> None:
        """Delete the message's key: its handler ended the transaction past ``Transaction``
        (through the driver), which may have committed the key with part of the work; the
        next delivery runs the handler again rather than ack it as a duplicate."""
        gone = sa.delete(inbox_received).where(
            inbox_received.c.consumer == sa.bindparam("consumer"),
            inbox_received.c.message_id == sa.bindparam("message_id"),
        )
        conn.execute(gone, self.key(message_id))

    def forget_attempts(self, conn: sa.Connection, message_id: str) -> None:
        """Delete the message's failed attempts (``relay inbox requeue``: its cause fixed, it
        gets its whole retry schedule again)."""
        conn.execute(sa.delete(inbox_attempts).where(*_of()), self.key(message_id))

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


class InboxStore:
    """One consumer's rows of the inbox tables, on one database, through blocking calls: each
    of ``InboxStatements`` in a transaction of its own (``call``), and a handler's run in the
    transaction that holds its key (``run``)."""

    def __init__(self, url: str, consumer: str) -> None:
        # No test query per delivery: a dropped connection fails one delivery, requeued.
        self.engine = create_engine(url, pre_ping=False, inbox_session=True)
        self.consumer = consumer
        self.where = redact_url(url)
        self.statements = InboxStatements(self.engine.dialect, consumer)

    def call(self, what: str, statement: Callable[..., T], *args: Any) -> T:
        """One of ``self.statements`` in a transaction of its own; StoreError when it fails."""
        with transaction(self.engine, what, self.where) as conn:
            return statement(conn, *args)

    def run(self, message_id: str, handler: Callable[[Transaction], object]) -> Ran:
        """``handler`` in the transaction that holds the message's key (``receive``), unless
        the key was there; StoreError when the inbox's own statements fail."""
        try:
            with self.receive(message_id) as tx:
                if tx is None:
                    return Ran(Outcome.DUPLICATE)
                started = time.perf_counter()
                try:
                    handler(tx)
                except Exception as exc:
                    raise _Raised from exc  # out of the transaction, which rolls back
        except _Raised as raised:
            assert isinstance(raised.__cause__, Exception)
            return Ran(Outcome.FAILED, error=raised.__cause__)
        except TransactionEnded as exc:  # past ``Transaction``: its key may have committed
            return Ran(Outcome.ENDED, error=exc)
        return Ran(Outcome.DONE, time.perf_counter() - started)

    @contextmanager
    def receive(self, message_id: str) -> Iterator[Transaction | None]:
        """A transaction whose first statement inserts the message's key: yields it open, to
        commit with whatever the caller writes in it, or None (and rolls back) when the key
        was there already: the message was processed before."""
        with (
            db_errors("the inbox's transaction", self.where),
            self.engine.connect() as conn,
            conn.begin() as tx,
        ):
            if not self.statements.add_key(conn, message_id):
                tx.rollback()
                yield None
                return
            yield Transaction(conn)
            if not still_open(conn):
                raise TransactionEnded("the handler's transaction was ended before its commit")

    def count_attempt(self, message_id: str, error: str) -> int:
        return self.call("counting an attempt", self.statements.count_attempt, message_id, error)

    def start_run(self, message_id: str) -> int:
        return self.call("marking a run", self.statements.start_run, message_id)

    def end_run(self, message_id: str) -> None:
        self.call("ending a run", self.statements.end_run, message_id)

    def forget(self, message_id: str) -> None:
        self.call("forgetting a key", self.statements.forget, message_id)

    def forget_attempts(self, message_id: str) -> None:
        self.call("forgetting attempts", self.statements.forget_attempts, message_id)

    def failures(self, message_id: str) -> Failures | None:
        return self.call("reading attempts", self.statements.failures, message_id)

    def attempts(self, message_id: str) -> int:
        return self.call("reading attempts", self.statements.attempts, message_id)

    def durability_problem(self) -> str | None:
        return self.call("reading the server's durability", self.statements.durability)

    def purge(self, older_than: float, chunk: int) -> int:
        """Delete this consumer's keys and attempts older than ``older_than`` seconds,
        ``chunk`` rows per transaction, until none is left (a consumer purges in slices of
        its own: ``relay.inbox.flow.Flow.purge_slice``)."""
        deleted = 0
        while True:
            count = self.call("purging the inbox", self.statements.purge_one, older_than, chunk)
            deleted += count
            if count < chunk:
                return deleted

    def close(self) -> None:
        self.engine.dispose()


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


def still_open(conn: sa.Connection) -> bool:
    """Whether the server still holds ``conn``'s transaction, as its driver knows without a
    round trip (PostgreSQL, SQLite): a handler may have ended it past ``Transaction``, through
    the driver's own connection. MySQL's driver does not say; ``Transaction`` refuses it
    there alone."""
    if not conn.in_transaction():
        return False
    # The driver's own connection, under an asyncio adapter too.
    return of(conn).still_open(conn.connection.driver_connection)
