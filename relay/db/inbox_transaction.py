"""What a handler writes with (``Transaction``): the message's own transaction, which it can
write and read in but not end. A statement sent as SQL text that would end or split it,
change its connection's session, or name the inbox's own tables is refused (``guarded``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa

from relay.db.dialects import Dialect, of
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


class TransactionEnded(RelayError):
    """A handler ended, or tried to end, the inbox's transaction: a failed attempt, never a
    commit."""


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
