"""What a handler writes with (``Transaction``): the message's own transaction, which it can
write and read in but not end. Whatever a handler's run sends on the transaction's connection
is judged as the driver gets it (``Guard``, told by SQLAlchemy's events on the connection:
``Guards``): each statement's text as compiled for its database, whatever construct carried
it (SQL text, DDL, a literal column, text in a CTE, ``exec_driver_sql``), and the
connection's own moves (a commit, a rollback, a savepoint, an isolation level), whoever made
them (a session bound to it, a handler that reached it through a result). One that would
end or split the transaction, change its connection's session, or name the inbox's own
tables is refused before it is sent, and the run is failed even if the handler catches the
refusal."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, NoReturn

import sqlalchemy as sa

from relay.db.dialects import Dialect, of
from relay.db.dialects.inbox import COMMITS_MADE
from relay.db.schema import inbox_attempts, inbox_received
from relay.db.sqltext import refusal
from relay.errors import RelayError

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
# SQLAlchemy's events for a connection's moves of its transaction (``ConnectionEvents``):
# none is a handler's to make (``Transaction.savepoint`` makes the inbox's own).
MOVES = (
    "begin",
    "commit",
    "rollback",
    "savepoint",
    "release_savepoint",
    "rollback_savepoint",
    "begin_twophase",
    "prepare_twophase",
    "commit_twophase",
    "rollback_twophase",
)
# The texts judged, remembered per engine: SQLAlchemy hands the same compiled string for a
# cached statement, so a run's statements are judged once each, not read at every send. A
# longer text (a many-row insert's, whose length varies with its rows) is judged each time,
# so that what is kept stays a few megabytes at most.
_JUDGED_KEPT = 1024
_JUDGED_KEPT_LONGEST = 4096
# The guard whose own moves (``Guard.own``) the running code is making: a mark of the task's
# (or thread's) own, not of the guard's. An asyncio handler's other task, sending on the
# same connection while ``tx.savepoint()`` awaits its SAVEPOINT, is judged; with a mark on
# the guard its COMMIT went through with the savepoint.
_OWN: ContextVar[Guard | None] = ContextVar("relay_inbox_own_move", default=None)


class TransactionEnded(RelayError):
    """A handler ended, or tried to end, the inbox's transaction: a failed attempt, never a
    commit."""


def judged(sql: str, database: Dialect) -> str | None:
    """Why a handler may not send ``sql`` (a statement's text as its driver gets it) on
    ``database``, or None: it holds a statement that would end or split the inbox's
    transaction, change its connection's session (which outlives the message: the next
    messages' runs would inherit it), or name the inbox's own tables
    (``relay.db.sqltext.refusal``)."""
    return refusal(
        sql,
        database.sql_lexicon,
        TRANSACTION_STATEMENTS | database.implicit_commits,
        database.changes_session,
        INBOX_TABLES,
    )


class Guard:
    """One run's guard: told of what its connection sends while the handler runs, it refuses
    (raises ``TransactionEnded``) what would end the transaction, and remembers the first
    refusal (``refused``): the run fails with it even if the handler caught it, since a
    handler that meant to commit a part of its work must not be acked as if it had. The
    inbox's own savepoints (``own``) go through. Once the handler ``returned``, the guard
    stays until the inbox lets the connection go, and nothing but the inbox's own goes out:
    a task or thread the handler left behind, sending through ``tx`` between the inbox's look
    at its key and its commit, had the commit undone (a failing statement aborts a
    PostgreSQL transaction, whose COMMIT is then a rollback) and the message acked."""

    __slots__ = ("_database", "_judged", "refused", "returned")

    def __init__(
        self, database: Dialect, judged_texts: dict[str, str | None] | None = None
    ) -> None:
        self._database = database
        self._judged = {} if judged_texts is None else judged_texts
        self.refused: TransactionEnded | None = None
        self.returned = False

    def statement(self, sql: str) -> None:
        """A statement's text, as the driver is about to get it."""
        if _OWN.get() is self:
            return
        try:
            why = self._judged[sql]
        except KeyError:
            why = judged(sql, self._database)
            if len(sql) <= _JUDGED_KEPT_LONGEST:
                if len(self._judged) >= _JUDGED_KEPT:
                    self._judged.clear()
                self._judged[sql] = why
        if why is not None:
            self._refuse(f"a handler may not run this statement: {why}")

    def moved(self, move: str) -> None:
        """A move of the transaction's (``MOVES``, or ``isolation_level``), about to be made."""
        if _OWN.get() is not self:
            self.still_running()
            words = move.replace("_", " ")
            self._refuse(f"a handler may not end or split the inbox's transaction ({words})")

    def ended(self) -> NoReturn:
        """A statement about to be sent with the message's transaction over (ended under the
        handler), where the driver would run it outside any transaction and commit it as it
        ran (``Dialect.outside_transaction``)."""
        self._refuse(
            "the inbox's transaction ended under the handler (a statement that rolled it "
            "back, the driver's rollback or commit): nothing more is run in the message's run"
        )

    def still_running(self) -> None:
        """Raises ``TransactionEnded`` once the handler returned: ``tx`` is its own while it
        runs, not a task's or a thread's it left behind. Not the run's refusal: the run was
        over, all the handler did in it committed or not with its key."""
        if self.returned and _OWN.get() is not self:
            raise TransactionEnded(
                "the handler's run is over: the inbox's transaction is the handler's while it "
                "runs, not a task's or a thread's it left behind (nothing was sent)"
            )

    def left(self, error: TransactionEnded) -> None:
        """What the handler left behind past the guard, found as its run ended
        (``relay.db.inbox_listeners``): the run's refusal, before any other it met, since it
        says why the run is not to be tried again."""
        self.refused = error

    def _refuse(self, why: str) -> NoReturn:
        error = TransactionEnded(why)
        if self.refused is None:
            self.refused = error
        raise error

    @contextmanager
    def own(self) -> Iterator[None]:
        """The inbox's own moves (``Transaction.savepoint``'s), let through: those the code
        inside makes, not another task's or thread's meanwhile (SQLAlchemy's asyncio greenlets
        run in the awaiting task's context)."""
        mark = _OWN.set(self)
        try:
            yield
        finally:
            _OWN.reset(mark)


class Guards:
    """The guards of an engine's connections while their handlers run (``running``), told
    of each connection's statements and moves by SQLAlchemy's events, listened for once on
    the engine (an asyncio engine's ``sync_engine``): a connection with no handler running
    costs a look in a dict per statement."""

    def __init__(self, engine: sa.Engine) -> None:
        self._database = of(engine)
        self._running: dict[sa.Connection, Guard] = {}
        self._judged: dict[str, str | None] = {}
        sa.event.listen(engine, "before_cursor_execute", self._statement)
        sa.event.listen(engine, "set_connection_execution_options", self._options)
        for move in MOVES:
            sa.event.listen(engine, move, self._mover(move))

    @contextmanager
    def running(self, conn: sa.Connection) -> Iterator[Guard]:
        """A handler's run on ``conn``, guarded, and after it until the inbox lets ``conn``
        go (``Guard.returned``)."""
        guard = self._running[conn] = Guard(self._database, self._judged)
        try:
            yield guard
        finally:
            del self._running[conn]

    def _statement(self, conn: sa.Connection, _cursor: Any, sql: str, *_: Any) -> None:
        guard = self._running.get(conn)
        if guard is None:
            return
        guard.still_running()  # the inbox's own statements after the handler go through
        if guard.returned:
            return
        if self._database.outside_transaction(conn.connection.driver_connection):
            guard.ended()  # the inbox's own savepoint's statements too
        guard.statement(sql)

    def _options(self, conn: sa.Connection, options: dict[str, Any]) -> None:
        # An isolation level set on a connection with a transaction open ends it on some
        # drivers (pysqlite commits as autocommit goes on), and outlives the message.
        guard = self._running.get(conn)
        if guard is not None and "isolation_level" in options:
            guard.moved("isolation_level")

    def _mover(self, move: str) -> Callable[..., None]:
        def moved(conn: sa.Connection, *_: Any) -> None:
            guard = self._running.get(conn)
            if guard is not None:
                guard.moved(move)
            if move == "commit":  # let through: counted (``COMMITS_MADE``)
                conn.info[COMMITS_MADE] = conn.info.get(COMMITS_MADE, 0) + 1

        return moved


class Transaction:
    """What a handler writes with: the open transaction its message's key went into, which
    it can write and read in but not end. A handler that committed its part and then failed
    left the key committed (the retry was acked as a duplicate, the rest of the work never
    done); one that rolled back and returned was acked with no key and no effect. So there is
    no commit, rollback or close here, and whatever would end the transaction is refused
    (``Guard``); ``savepoint()`` rolls back a part of the handler's work on its own."""

    __slots__ = ("_conn", "_guard")

    def __init__(self, conn: sa.Connection, guard: Guard) -> None:
        self._conn = conn
        self._guard = guard

    @property
    def dialect(self) -> sa.Dialect:
        return self._conn.dialect

    def execute(
        self, statement: Any, parameters: Any = None, **options: Any
    ) -> sa.CursorResult[Any]:
        """``sa.Connection.execute``: a statement (or SQL text as a string), its parameters (a
        dict, or a list of them for many rows), execution options as keywords."""
        self._guard.still_running()
        return self._conn.execute(executable(statement), parameters, execution_options=options)

    def scalar(self, statement: Any, parameters: Any = None) -> Any:
        return self.execute(statement, parameters).scalar()

    def scalars(self, statement: Any, parameters: Any = None) -> sa.ScalarResult[Any]:
        return self.execute(statement, parameters).scalars()

    @contextmanager
    def savepoint(self) -> Iterator[Transaction]:
        """A part of the handler's work that an exception inside rolls back alone (and goes
        on out of the block)."""
        self._guard.still_running()
        with self._guard.own():
            nested = self._conn.begin_nested()
        try:
            yield self
        except BaseException:
            with self._guard.own():
                nested.rollback()
            raise
        with self._guard.own():
            nested.commit()


def executable(statement: Any) -> Any:
    """A handler's statement; SQL text given as a string made a ``TextClause``."""
    return sa.text(statement) if isinstance(statement, str) else statement
