"""What the inbox asks of a database (``InboxDialect``, the part of ``relay.db.dialects.base``'s
``Dialect`` that is the inbox's): how its guard reads a handler's SQL, how its sessions are
kept durable, and how it tells what a handler did to the message's transaction past the
guard. Each database's module overrides what differs there."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, ClassVar

import sqlalchemy as sa

from relay.db.sqltext import Lexicon

# A connection's info: the commits SQLAlchemy made on it (``relay.db.inbox_transaction.Guards``
# counts those it lets through), for a dialect that tells a handler's commits past the guard
# by the session's own count of them (``InboxDialect.went_on``).
COMMITS_MADE = "relay_inbox_commits_made"


class InboxDialect:
    """The inbox's part of a database (``relay.db.dialects.base.Dialect``)."""

    name: ClassVar[str]
    # How the database reads SQL text (``relay.db.sqltext``), and the statements that end a
    # transaction besides the transaction's own (MySQL's implicit commits): what the inbox's
    # guard refuses of a handler.
    sql_lexicon: ClassVar[Lexicon] = Lexicon()
    implicit_commits: ClassVar[frozenset[tuple[str, ...]]] = frozenset()
    # What the inbox's look at its key selects, the last statement before its commit
    # (``InboxStatements.holds_key``): where a handler can make its transaction's commit
    # not durable, the look makes it durable again in the same round trip.
    key_look: ClassVar[str] = "1"
    # SQL of what the key's insert returns and the look reads back, to tell the row this
    # run's transaction inserted from the same key another transaction committed (a second
    # consumer's, given the message while the first one's transaction was rolled back under
    # its handler): PostgreSQL's xmin. None where the transaction is marked instead
    # (``mark_key``), or where no other run can commit the key while one holds it (SQLite's
    # run lock).
    key_token: ClassVar[str | None] = None
    # The schema the look at the key names, where a table of the session's own could come
    # before the inbox's (None: the look names the table as the schema does).
    key_schema: ClassVar[str | None] = None

    def commit_sql(self, driver: Any, token: Any) -> str:
        """What the inbox sends on ``driver`` to commit the message's transaction, whose
        key's insert returned ``token`` (``key_token``): a plain COMMIT where nothing checks,
        in the same message, that the transaction is still the key's."""
        return "COMMIT"

    def mark_key(self, conn: sa.Connection) -> None:
        """Mark ``conn``'s transaction right after its key's insert, for ``key_marked``."""
        return None

    def key_marked(self, conn: sa.Connection) -> bool | None:
        """At the run's end: whether ``conn``'s transaction is still the one ``mark_key``
        marked (the one that inserted the key); None where nothing is marked (the key's row
        is looked at, ``key_token``)."""
        return None

    def rolled_back_in_part(self, conn: sa.Connection) -> bool:
        """Roll back ``conn``'s transaction, a handler's run failed: whether the rollback
        left a part of it in place, the database saying so."""
        conn.rollback()
        return False

    def durability_problem(self, conn: sa.Connection) -> str | None:
        """Why a commit may not survive a crash of the database's host, where a session
        cannot set it, or None."""
        return None

    def run_lock_path(self, url: sa.URL) -> Path | None:
        """Where the inbox's consumers of the database at ``url`` take their runs one at a
        time (``relay.db.runlock``), where one writer at a time calls for it; else None."""
        return None

    def changes_session(self, words: tuple[str, ...]) -> bool:
        """Whether a statement of these words (``relay.db.sqltext``) changes its connection's
        session beyond the transaction: a handler's setting would outlive its message."""
        return False

    def session_changed(self, driver: Any) -> bool:
        """Whether the driver's connection ``driver`` is in a state the inbox's transactions
        cannot work in (autocommit on: each statement its own transaction), as the driver
        knows without a round trip; a handler can leave it so, past ``Transaction``."""
        return False

    def outside_transaction(self, driver: Any) -> bool:
        """Whether a statement the driver's connection ``driver`` were sent now would run
        outside any transaction, committed as it runs, rather than begin one (the message's
        transaction ended under the handler): the guard refuses it. False where the driver
        begins one, or cannot say without a round trip."""
        return False

    @contextmanager
    def watched(self, conn: sa.Connection) -> Iterator[None]:
        """A handler's run on ``conn``, watched where ``went_on`` needs it."""
        yield

    def went_on(self, conn: sa.Connection) -> bool | None:
        """After a handler's run on ``conn`` whose transaction may have ended under it
        (rolled back past the guard, or by a statement of the handler's own): whether the
        connection ran anything since it ended (then a part of the handler's work may have
        been committed past the message's transaction, and a retry would do it again). None
        where the database cannot tell from here: ``holds_transaction`` is asked from
        another connection. False where it is not looked for."""
        return False

    def holds_transaction(self, conn: sa.Connection, backend: Any, token: Any) -> bool:
        """Seen from ``conn``, another connection: whether the session ``backend`` (whose
        ``went_on`` said None) still holds the message's transaction, the one whose key's
        insert returned ``token`` (``key_token``)."""
        raise NotImplementedError(self.name)

    def backend(self, driver: Any) -> Any:
        """The driver's connection's session, as ``holds_transaction`` names it."""
        raise NotImplementedError(self.name)

    def session_left(self, conn: sa.Connection) -> str | None:
        """What ``conn``'s session holds, no transaction open, that a transaction's end did not
        undo and the inbox's sessions never hold of their own (a temporary table, a prepared
        statement), or None: the next message's run on the pooled connection would inherit
        it. What can be reset cheaply (a setting made for the session through a function or
        a block) is reset here instead."""
        return None

    def error_facts(self, error: BaseException) -> list[str] | None:
        """What the driver's ``error`` says that names no value (its SQLSTATE or error number,
        the constraint, table and column it concerns), for a record of a failure that must
        not hold a payload or a statement's parameters (``relay.inbox.policy.describe``);
        None for an error that is not this driver's."""
        return None
