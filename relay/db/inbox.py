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

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any, NamedTuple, TypeVar

import psycopg
import sqlalchemy as sa

from relay.constants import LAST_ERROR_MAX_CHARS
from relay.db.clock import database_time
from relay.db.dialects import Dialect, of
from relay.db.engine import create_engine, db_errors, transaction
from relay.db.runlock import RunLock
from relay.db.schema import inbox_attempts, inbox_received
from relay.db.sqltext import refusal
from relay.db.statements import run_delete
from relay.errors import RelayError, StoreError
from relay.redact import redact_url

T = TypeVar("T")

# The inbox's own tables, which a handler may not name (the transaction's key is in one).
INBOX_TABLES = frozenset({inbox_received.name.upper(), inbox_attempts.name.upper()})
# Statements that end or split a transaction on every database, by their first words
# (``relay.db.sqltext``); a dialect adds its implicit commits, and any ``SET`` of autocommit
# is refused too.
TRANSACTION_STATEMENTS: frozenset[tuple[str, ...]] = frozenset(
    {
        ("COMMIT",),
        ("ROLLBACK",),
        ("ABORT",),
        ("END",),
        ("BEGIN",),
        ("START", "TRANSACTION"),
        ("SAVEPOINT",),
        ("RELEASE",),
        ("PREPARE", "TRANSACTION"),
        ("SET", "TRANSACTION"),
        ("SET", "SESSION", "TRANSACTION"),
        ("SET", "SESSION", "CHARACTERISTICS"),
        ("XA",),
    }
)


# The reason counted for a run that died inside its handler.
CRASHED = "the consumer stopped inside the handler"


class Failures(NamedTuple):
    """What the inbox counted against a message: for its dead letter's headers."""

    attempts: int
    last_error: str | None
    first_failed_at: datetime | None
    last_failed_at: datetime | None


class TransactionEnded(RelayError):
    """A handler ended, or tried to end, the inbox's transaction: a failed attempt, never a
    commit."""


class TransactionFailed(StoreError):
    """The message's own transaction failed at its end with its connection alive (a deferred
    constraint at the commit, a transaction a handler's swallowed error aborted): the
    message's failure, counted, not the database away."""


def guarded(statement: Any, dialect: Dialect) -> Any:
    """A handler's statement (SQL text made a ``TextClause``), refused when its text holds a
    statement that would end or split the inbox's transaction on ``dialect``'s database,
    change its connection's session (which outlives the message: the next messages' runs
    would inherit it), or name the inbox's own tables (``relay.db.sqltext.refusal``)."""
    if isinstance(statement, str):
        statement = sa.text(statement)
    if isinstance(statement, sa.TextClause):
        why = refusal(
            statement.text,
            dialect.sql_lexicon,
            TRANSACTION_STATEMENTS | dialect.implicit_commits,
            dialect.changes_session,
            INBOX_TABLES,
        )
        if why is not None:
            raise TransactionEnded(f"a handler may not run this statement: {why}")
    return statement


class Transaction:
    """What a handler writes with: the open transaction its message's key went into, which
    it can write and read in but not end. A handler that committed its part and then failed
    left the key committed (the retry was acked as a duplicate, the rest of the work never
    done); one that rolled back and returned was acked with no key and no effect. So there is
    no commit, rollback or close here, and a transaction statement sent as SQL text is
    refused; ``savepoint()`` rolls back a part of the handler's work on its own."""

    __slots__ = ("_conn", "_database")

    def __init__(self, conn: sa.Connection) -> None:
        self._conn = conn
        self._database = of(conn)

    @property
    def dialect(self) -> sa.Dialect:
        return self._conn.dialect

    def execute(
        self, statement: Any, parameters: Any = None, **options: Any
    ) -> sa.CursorResult[Any]:
        """``sa.Connection.execute``: a statement, its parameters (a dict, or a list of them
        for many rows), execution options as keywords."""
        return self._conn.execute(
            guarded(statement, self._database), parameters, execution_options=options
        )

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
        returning: sa.ClauseElement = self.insert_key.returning(sa.literal_column("1"))
        # The key's insert as psycopg runs it (``add_key``): its row says it went in.
        self.key_sql = str(returning.compile(dialect=dialect))
        self._count_attempt = _upsert_attempt(dialect)
        self._mark_run = self.database.insert_or_ignore(inbox_attempts).values(
            consumer=sa.bindparam("consumer"), message_id=sa.bindparam("message_id"), attempts=0
        )
        self._key_there: sa.Select[Any] = sa.select(sa.literal_column("1")).where(
            inbox_received.c.consumer == sa.bindparam("consumer"),
            inbox_received.c.message_id == sa.bindparam("message_id"),
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
        is the one psycopg begins here, and commits or rolls back as usual."""
        key = self.key_row(message_id)
        found = _row_through_psycopg(conn, self.key_sql, key)
        if found is not None:
            return found
        inserted = conn.execute(
            self.insert_key, key, execution_options={"preserve_rowcount": True}
        ).rowcount
        return bool(inserted)

    def holds_key(self, conn: sa.Connection, message_id: str) -> bool:
        """Whether the message's key is in ``conn``'s transaction, as the handler leaves it:
        inserted there, or committed (by a handler that committed its work through a door of
        its own: nothing is lost). Not there: the transaction that held it was rolled back
        past ``Transaction``, and this one is another. Straight through psycopg, as
        ``add_key``: a look per delivery."""
        key = self.key_row(message_id)
        found = _row_through_psycopg(conn, self.key_there_sql, key)
        if found is not None:
            return found
        return conn.execute(self._key_there, key).first() is not None

    def key_committed(self, conn: sa.Connection, message_id: str) -> bool:
        """Whether the message's key is committed, seen from a transaction of its own."""
        return self.holds_key(conn, message_id)

    def count_attempt(
        self, conn: sa.Connection, message_id: str, error: str, forget_key: bool = False
    ) -> int:
        """One more failed attempt at the message, its run over; with ``forget_key``, its key
        deleted too (a handler that ended the transaction committed it with part of its
        work: the next delivery runs the handler again rather than ack it as a duplicate).
        Returns how many attempts there have been."""
        key = self.key(message_id)
        if forget_key:
            gone = sa.delete(inbox_received).where(
                inbox_received.c.consumer == sa.bindparam("consumer"),
                inbox_received.c.message_id == sa.bindparam("message_id"),
            )
            conn.execute(gone, key)
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
        if self.holds_key(conn, message_id):
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


def _row_through_psycopg(conn: sa.Connection, sql: str, parameters: dict[str, str]) -> bool | None:
    """Whether ``sql`` (compiled for psycopg) returns a row, run straight through psycopg's
    blocking connection under ``conn``; None on another driver. Its error as SQLAlchemy's
    would be, the connection invalidated when the error says it was lost (``lost``)."""
    driver = conn.connection.driver_connection
    if not isinstance(driver, psycopg.Connection):
        return None
    try:
        return driver.execute(sql, parameters).fetchone() is not None
    except psycopg.Error as exc:
        error: Any = exc  # psycopg's, which SQLAlchemy's dialect knows by its own name
        gone = conn.dialect.is_disconnect(error, conn.connection.dbapi_connection, None)
        if gone:
            conn.invalidate(exc)
        raise sa.exc.DBAPIError.instance(
            sql, parameters, exc, psycopg.Error, connection_invalidated=gone
        ) from exc


def lost(exc: BaseException, conn: sa.Connection) -> bool:
    """Whether the message's connection was lost (SQLAlchemy found the driver's error a
    disconnect, and invalidated it): the database is away, and nothing of the message's
    transaction is the message's fault. A statement that failed on a live connection (a
    constraint, a lock or statement timeout, a serialization failure) is."""
    return conn.invalidated or (isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated)


@contextmanager
def classified(what: str, where: str, conn: sa.Connection) -> Iterator[None]:
    """A statement of the message's transaction, or its commit: the driver's error as
    StoreError when the connection was lost (``lost``), else as ``TransactionFailed``."""
    try:
        with db_errors(what, where):
            yield
    except StoreError as exc:
        cause = exc.__cause__
        if cause is not None and not lost(cause, conn):
            raise TransactionFailed(str(exc), summary=exc.summary) from cause
        raise


class InboxStore:
    """One consumer's rows of the inbox tables, on one database, through blocking calls: each
    of ``InboxStatements`` in a transaction of its own (``call``), and a delivery's steps
    (``relay.inbox.flow.Doer``) through ``message``."""

    def __init__(self, url: str, consumer: str) -> None:
        # No test query per delivery: a dropped connection fails one delivery, requeued.
        self.engine = create_engine(url, pre_ping=False, inbox_session=True)
        self.consumer = consumer
        self.where = redact_url(url)
        self.statements = InboxStatements(self.engine.dialect, consumer)
        self._run_lock = run_lock(self.engine.url)

    def call(self, what: str, statement: Callable[..., T], *args: Any) -> T:
        """One of ``self.statements`` in a transaction of its own; StoreError when it fails."""
        with transaction(self.engine, what, self.where) as conn:
            return statement(conn, *args)

    @contextmanager
    def message(self, handler: Callable[[Transaction], object]) -> Iterator[MessageRun]:
        """A delivery's steps, ``handler`` run in the message's transaction; whatever the
        steps leave open (the database away, the consumer stopping inside the handler) is
        rolled back at the end."""
        run = MessageRun(self, handler)
        with self._run_lock or contextlib.nullcontext():
            try:
                yield run
            finally:
                run.rollback(discard=False)

    def forget_attempts(self, message_ids: Sequence[str]) -> None:
        if message_ids:
            self.call("forgetting attempts", self.statements.forget_attempts, message_ids)

    def failures(self, message_id: str) -> Failures | None:
        return self.call("reading attempts", self.statements.failures, message_id)

    def attempts(self, message_id: str) -> int:
        return self.call("reading attempts", self.statements.attempts, message_id)

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
        if self._run_lock is not None:
            self._run_lock.close()


def run_lock(url: sa.URL) -> RunLock | None:
    """The lock the consumers of the database at ``url`` take their runs under, where its
    dialect calls for one (``Dialect.run_lock_path``)."""
    path = of(url.get_dialect().name).run_lock_path(url)
    return None if path is None else RunLock(path)


class MessageRun:
    """One delivery's steps on the blocking store (``relay.inbox.flow.Doer``): statements in
    transactions of their own, and the message's transaction on a connection held from its
    key's insert to its commit or rollback."""

    def __init__(self, store: InboxStore, handler: Callable[[Transaction], object]) -> None:
        self._store = store
        self._handler = handler
        self._conn: sa.Connection | None = None
        self.call = store.call

    def open(self, key: str) -> bool:
        store = self._store
        with db_errors("the inbox's transaction", store.where):
            self._conn = store.engine.connect()
            self._conn.begin()
            return store.statements.add_key(self._conn, key)

    def handle(self) -> Exception | None:
        assert self._conn is not None
        try:
            self._handler(Transaction(self._conn))
        except Exception as exc:
            if lost(exc, self._conn):
                summary = f"the handler's connection to {self._store.where} was lost"
                raise StoreError(summary, summary=summary) from exc
            return exc
        return None

    def execute(self, what: str, statement: Callable[..., T], *args: Any) -> T:
        assert self._conn is not None
        with classified(what, self._store.where, self._conn):
            return statement(self._conn, *args)

    def commit(self) -> None:
        assert self._conn is not None
        try:
            with classified("the inbox's commit", self._store.where, self._conn):
                self._conn.commit()
        finally:
            self._release(discard=False)

    def rollback(self, discard: bool) -> None:
        if self._conn is not None:
            self._release(discard)

    def _release(self, discard: bool) -> None:
        """The message's connection back to the pool, rolled back; discarded instead when its
        session may have been changed (``discard``, or the driver says autocommit is on).
        Never raises: a connection that fails to close is dropped, and the database rolls
        back what it held."""
        conn, self._conn = self._conn, None
        assert conn is not None
        try:
            if not conn.invalidated and (
                discard or of(conn).session_changed(conn.connection.driver_connection)
            ):
                conn.invalidate()  # rolled back by the server as the connection closes
            conn.close()
        except sa.exc.SQLAlchemyError:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                conn.invalidate()


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
