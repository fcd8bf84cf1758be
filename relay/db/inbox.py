"""The inbox's blocking store (``InboxStore``): each of its statements
(``relay.db.inbox_statements``) in a transaction of its own, and a delivery's steps
(``MessageRun``) on a connection that holds the message's transaction from its key's insert
to its commit or rollback; its asyncio twin is ``relay.db.inbox_async``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import sqlalchemy as sa

from relay.db.dialects import of
from relay.db.engine import create_engine, db_errors, transaction
from relay.db.inbox_listeners import kept_off
from relay.db.inbox_statements import Failures, InboxStatements, inserted_token
from relay.db.inbox_transaction import Guard, Guards, Transaction
from relay.db.runlock import RunLock
from relay.errors import StoreError
from relay.redact import redact_url

T = TypeVar("T")
log = logging.getLogger(__name__)


class TransactionFailed(StoreError):
    """The message's own transaction failed at its end with its connection alive (a deferred
    constraint at the commit, a transaction a handler's swallowed error aborted): the
    message's failure, counted, not the database away."""


# Why a COMMIT that rolled back (``InboxStatements.commit``) failed its message.
ROLLED_BACK = "the message's transaction was rolled back at its commit: an error aborted it"


def lost(exc: BaseException, conn: sa.Connection) -> bool:
    """Whether the message's connection was lost (SQLAlchemy found the driver's error a
    disconnect, and invalidated it): the database is away, and nothing of the message's
    transaction is the message's fault. A statement that failed on a live connection (a
    constraint, a lock or statement timeout, a serialization failure) is."""
    return conn.invalidated or (isinstance(exc, sa.exc.DBAPIError) and exc.connection_invalidated)


class Interrupted(Exception):
    """A handler cut off by what is not an error (``KeyboardInterrupt``, ``SystemExit``,
    ``asyncio.CancelledError``): its run is looked at as a failed one's is (a part committed
    past the guard is dead-lettered, not done again at the next delivery), then
    ``interruption`` goes on, never swallowed (``relay.inbox.flow``)."""

    def __init__(self, interruption: BaseException) -> None:
        super().__init__(type(interruption).__name__)
        self.interruption = interruption


def handler_failed(exc: BaseException, conn: sa.Connection, where: str, guard: Guard) -> Exception:
    """What a handler's exception makes of its run: ``Interrupted`` for what is not an
    error, the guard's refusal if it refused a statement (the handler may have caught it),
    else the exception; the database away (``lost``) is no failure of the message's, raised
    as ``StoreError``."""
    if not isinstance(exc, Exception):
        return Interrupted(exc)
    if lost(exc, conn):
        summary = f"the handler's connection to {where} was lost"
        raise StoreError(summary, summary=summary) from exc
    return guard.refused or exc


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


def spoilt(conn: sa.Connection, discard: bool) -> bool:
    """Whether the message's connection, its run over, is not to be used again: ``discard``
    (the handler may have changed its session), the driver's autocommit left on, or, once
    whatever is open is rolled back, its session holding what the handler left in it past
    the guard (``Dialect.session_left``): the next message on the pooled connection would
    inherit it, a commit without a flush say, or a read-only session that it would fail on
    as if the database were away."""
    database = of(conn)
    if discard or database.session_changed(conn.connection.driver_connection):
        return True
    conn.rollback()
    left = database.session_left(conn)
    if left is None:
        return False
    log.warning(
        "a handler left %s in its connection's session: the connection is discarded",
        left,
        extra={"action": "inbox_session_discarded"},
    )
    return True


def kept_by_rollback(conn: sa.Connection) -> bool:
    """The message's transaction, a handler's run failed, rolled back: whether a part of the
    run's work stayed (``Dialect.rolled_back_in_part``), as committed. Asked whether or not
    SQLAlchemy holds a transaction still: a commit the guard refused leaves it none, and the
    driver's transaction open (an outside review's write to a MariaDB table without
    transactions, then a refused commit: its warning went to the pool's rollback, unread)."""
    return of(conn).rolled_back_in_part(conn)


def own(guard: Guard | None) -> contextlib.AbstractContextManager[None]:
    """The inbox's own statements and moves on the message's connection after its handler
    (``Guard.returned``), let through; none to let through before the handler ran."""
    return contextlib.nullcontext() if guard is None else guard.own()


# What ``Doer.went_on``'s look from another connection is called in its error.
LOOKING = "looking at the message's transaction"


def went_on_here(conn: sa.Connection) -> bool | None:
    """``relay.inbox.steps.Doer.went_on`` as ``conn`` tells it (``Dialect.went_on``); None:
    to be asked from another connection (``holds_inbox``): whether its session still holds
    the transaction that inserted the key, even where the key is gone from it (a handler
    that deleted it there, past the guard: nothing of the run committed, and it is retried)."""
    if conn.closed:  # by the handler (refused, too late): the pool rolled it back
        return False
    return of(conn).went_on(conn)


def holds_inbox(conn: sa.Connection) -> tuple[Callable[..., bool], object, object]:
    """The statement (and its arguments) another connection asks whether ``conn``'s backend
    still holds the transaction that inserted the message's key
    (``Dialect.holds_transaction``)."""
    database = of(conn)
    backend = database.backend(conn.connection.driver_connection)
    return database.holds_transaction, backend, inserted_token(conn)


class InboxStore:
    """One consumer's rows of the inbox tables, on one database, through blocking calls: each
    of ``InboxStatements`` in a transaction of its own (``call``), and a delivery's steps
    (``relay.inbox.steps.Doer``) through ``message``."""

    def __init__(self, url: str, consumer: str) -> None:
        # No test query per delivery: a dropped connection fails one delivery, requeued.
        self.engine = create_engine(url, pre_ping=False, inbox_session=True)
        self.consumer = consumer
        self.where = redact_url(url)
        self.statements = InboxStatements(self.engine.dialect, consumer)
        self.guards = Guards(self.engine)
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
    """One delivery's steps on the blocking store (``relay.inbox.steps.Doer``): statements in
    transactions of their own, and the message's transaction on a connection held from its
    key's insert to its commit or rollback."""

    def __init__(self, store: InboxStore, handler: Callable[[Transaction], object]) -> None:
        self._store = store
        self._handler = handler
        self._conn: sa.Connection | None = None
        # The handler's guard, from its run to the connection's release (``Guard.returned``).
        self._guarding = contextlib.ExitStack()
        self._guard: Guard | None = None
        self.call = store.call

    def open(self, key: str) -> bool:
        """The message's transaction opened with its key. A connection that fails the key's
        insert is discarded, not pooled: one an earlier handler left read-only (SQLite's
        ``PRAGMA query_only``, MariaDB's ``SET SESSION TRANSACTION READ ONLY``, through the
        driver) failed every later message's insert as the database away, for ever (an
        outside review)."""
        store = self._store
        try:
            with db_errors("the inbox's transaction", store.where):
                self._conn = store.engine.connect()
                self._conn.begin()
                return store.statements.add_key(self._conn, key)
        except StoreError:
            if self._conn is not None:
                self._release(discard=True)
            raise

    def handle(self) -> Exception | None:
        """The handler's error; a refusal of the guard's first, even if the handler caught
        it (``Guard``)."""
        conn = self._conn
        assert conn is not None
        guard = self._guard = self._guarding.enter_context(self._store.guards.running(conn))
        try:
            with self._store.statements.database.watched(conn), kept_off(conn, guard):
                self._handler(Transaction(conn, guard))
        except BaseException as exc:  # an interruption's end-of-run checks too
            return handler_failed(exc, conn, self._store.where, guard)
        finally:
            guard.returned = True
        return guard.refused

    def went_on(self) -> bool:
        """``relay.inbox.steps.Doer.went_on``: as the database tells (``Dialect.went_on``),
        or from another connection where it cannot from this one."""
        conn = self._conn
        assert conn is not None
        with classified(LOOKING, self._store.where, conn), own(self._guard):
            seen = went_on_here(conn)
        if seen is not None:
            return seen
        return not self.call(LOOKING, *holds_inbox(conn))

    def execute(self, what: str, statement: Callable[..., T], *args: Any) -> T:
        assert self._conn is not None
        with classified(what, self._store.where, self._conn), own(self._guard):
            return statement(self._conn, *args)

    def commit(self) -> None:
        conn = self._conn
        assert conn is not None
        try:
            with classified("the inbox's commit", self._store.where, conn), own(self._guard):
                if not self._store.statements.commit(conn):
                    raise TransactionFailed(ROLLED_BACK, summary=ROLLED_BACK)
        finally:
            self._release(discard=False, failed=False)

    def rollback(self, discard: bool) -> bool:
        return self._conn is not None and self._release(discard)

    def _release(self, discard: bool, failed: bool = True) -> bool:
        """The message's connection back to the pool, rolled back; discarded instead when its
        session may have been changed (``spoilt``). Whether the rollback of a ``failed``
        handler's run left a part of its work (``kept_by_rollback``).
        Never raises: a connection that fails to close is dropped, and the database rolls
        back what it held."""
        conn, self._conn = self._conn, None
        assert conn is not None
        kept = False
        try:
            with own(self._guard):
                ran = failed and self._guard is not None and not conn.invalidated
                kept = ran and kept_by_rollback(conn)
                if not conn.invalidated and spoilt(conn, discard):
                    conn.invalidate()  # rolled back by the server as the connection closes
                conn.close()
        except sa.exc.SQLAlchemyError:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                conn.invalidate()
        finally:
            self._guard = None
            self._guarding.close()  # the guard's last: the connection is the pool's now
        return kept
