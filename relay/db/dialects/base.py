"""The interface every database's module implements (``relay.db.dialects``).

Each piece is here because the databases differ in it; where two of them agree, the
default here is theirs and the third overrides it. Everything else in ``relay.db`` is
written once, for all of them.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import sqlalchemy as sa

from relay.db.dialects.inbox import InboxDialect

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

# An execution option: the statement's results in the database's binary format, where it has
# one (PostgreSQL: ``relay.db.dialects.postgresql``).
BINARY_RESULTS = "outbox_binary_results"
# A row change's fields, as ``changes_table`` binds them (``relay.records.RowChange``'s).
CHANGE_COLUMNS: tuple[tuple[str, sa.types.TypeEngine[Any]], ...] = (
    ("id", sa.BigInteger()),
    ("status", sa.Text()),
    ("attempts", sa.Integer()),
    ("delay", sa.Float()),
    ("last_error", sa.Text()),
    ("cause", sa.Text()),
    ("suspect", sa.Boolean()),
)


class Dialect(InboxDialect, abc.ABC):
    """One database, as the relay, the inbox, the admin commands and the Spark writer use it."""

    # SQLAlchemy's name of the dialect, and the backend names of the URLs that reach it.
    name: ClassVar[str]
    url_backends: ClassVar[tuple[str, ...]]
    # ``relay.db.clock``'s epoch, as a time literal of this database.
    epoch: ClassVar[str] = "'1970-01-01'"
    # One writer at a time and no row locks (the claim store queues its own writes).
    one_writer: ClassVar[bool] = False
    # Text read leniently, to be checked row by row by the decoder (``relay.db.decode``).
    lenient_text: ClassVar[bool] = False
    # The claim leaves the byte budget's cut to its reader (``relay.db.due.within_budget``;
    # ``claim_statement`` says why).
    budget_cut_as_read: ClassVar[bool] = False
    # The claim's candidates carry ids only, the rows read by id at the end (``relay.db.due``).
    claims_carry_ids: ClassVar[bool] = False
    # The sent log is unlogged (no WAL, emptied by a crash) and each ack's entries are also
    # written to a logged journal it is rebuilt from (``relay.db.schema.outbox_sent_journal``,
    # ``relay.db.sentlog``); an ack deletes its rows, logs their keys and journals them in one
    # statement (``relay.db.settles``). Elsewhere an ack is two statements of a transaction.
    journals_sent_log: ClassVar[bool] = False
    # Whether the database may hand a row's id out again while a relay holds the row: a
    # failover to an asynchronous replica, a restore to a point in time (``relay.db.settles``
    # then finds a settle's rows by their message ids too). Not SQLite's one file.
    reuses_ids: ClassVar[bool] = True
    # Partial indexes (``relay.db.schema``).
    partial_indexes: ClassVar[bool] = True
    # Text compared byte by byte (``prefixed``): the columns' own collation is so on SQLite
    # (BINARY) and MySQL (the NO PAD binary ones).
    prefix_operators: ClassVar[tuple[str, str]] = (">=", "<")
    # Times bound with their zone (else as naive UTC).
    aware_times: ClassVar[bool] = False
    # The Spark writer (``relay.db.sink``): rows COPY-ed in, stages unlogged and a merge tried
    # as a plain INSERT first; a staging table's lock held by a session.
    copies_rows: ClassVar[bool] = False
    stage_locks: ClassVar[bool] = False

    # Engines ------------------------------------------------------------------------------

    @abc.abstractmethod
    def engine(
        self, url: sa.URL, *, relay_session: bool, inbox_session: bool, pre_ping: bool
    ) -> sa.Engine:
        """An engine for ``url`` (``relay.db.engine.create_engine`` says which sessions)."""

    @abc.abstractmethod
    def async_engine(self, url: sa.URL) -> AsyncEngine:
        """An asyncio engine with an inbox's sessions (``relay.db.engine``)."""

    def short_reads(self, engine: sa.Engine) -> None:
        """Make ``engine``'s sessions plan for short reads only (the operator console's: a
        page of an index, counts that stop at a cap)."""
        return None  # nothing to set where the planner compiles nothing ahead

    def autocommit(self, engine: sa.Engine) -> sa.Engine:
        """``engine`` for statements that each commit on their own (the relay's claims and
        settles, whose transactions are explicit)."""
        return engine.execution_options(isolation_level="AUTOCOMMIT")

    # Types and functions (``relay.db.columns``, ``relay.db.clock``) -------------------------

    def short_text(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        """``SHORT_TEXT``'s type here."""
        return sa.Text()

    def utc_datetime(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any] | None:
        """``UTCDateTime``'s type here; None: a timezone-aware DateTime."""
        return None

    def index_columns(self, columns: list[str]) -> list[str]:
        """A partial index's columns as created here (``relay.db.schema``)."""
        return columns

    @abc.abstractmethod
    def new_message_id(self) -> str:
        """SQL of a random message id, as a column default."""

    def prefixed(
        self,
        column: sa.ColumnElement[str],
        start: sa.ColumnElement[str],
        end: sa.ColumnElement[str] | None,
    ) -> list[sa.ColumnElement[bool]]:
        """``column`` starts with a prefix: from ``start`` (the prefix) to before ``end``
        (``relay.db.console.prefix_end``; None: no end), byte by byte
        (``prefix_operators``), as one range of an index."""
        at_least, below = (column.op(o, is_comparison=True) for o in self.prefix_operators)
        return [at_least(start), *([] if end is None else [below(end)])]

    def stored_now(self, now: str) -> str:
        """SQL of the current time as a column default (``now``: SQLAlchemy's ``now()``)."""
        return now

    @abc.abstractmethod
    def sent_key(self, message_id: str) -> str:
        """SQL of a message id's key in the sent log (``relay.db.columns.sent_key``)."""

    @abc.abstractmethod
    def sent_key_value(self, message_id: str) -> str | bytes:
        """``sent_key`` computed here, as the driver returns it."""

    @abc.abstractmethod
    def database_time(self, seconds: str) -> str:
        """SQL of the database's time plus ``seconds`` (SQL of a number)."""

    @abc.abstractmethod
    def seconds_between(self, start: str, end: str) -> str:
        """SQL of the seconds from the time ``start`` to the time ``end``."""

    # Statements ---------------------------------------------------------------------------

    @abc.abstractmethod
    def insert(self, table: sa.Table) -> Any:
        """The database's own INSERT construct (with its conflict clauses)."""

    def insert_or_ignore(self, table: sa.Table) -> sa.Insert:
        """An INSERT that skips a row whose key is there already; its row count is the rows
        it added."""
        return self.insert(table).on_conflict_do_nothing()  # type: ignore[no-any-return]

    def insert_skipping(
        self,
        table: sa.Table,
        unique: list[str],
        rows: tuple[list[str], sa.Select[Any]] | None = None,
        *,
        all_new: bool = False,
    ) -> sa.Insert:
        """An INSERT (of ``rows``: columns and a SELECT, when given) that skips a row whose
        ``unique`` columns match one there already, unless ``all_new`` says none can (then
        one fails it), and fails on any other error (no value truncated)."""
        statement = self.insert(table)
        if rows is not None:
            statement = statement.from_select(*rows)
        if all_new:
            return statement  # type: ignore[no-any-return]
        return self.skip_duplicates(statement, table, unique)

    def skip_duplicates(self, statement: Any, table: sa.Table, unique: list[str]) -> sa.Insert:
        """``statement`` (this database's INSERT) made to skip a row whose ``unique`` columns
        match one there already."""
        return statement.on_conflict_do_nothing(index_elements=unique)  # type: ignore[no-any-return]

    def upsert(
        self, table: sa.Table, values: dict[str, Any], unique: list[str], changes: dict[str, Any]
    ) -> sa.Insert:
        """An INSERT of ``values`` that, where a row with the same ``unique`` columns is
        there, makes ``changes`` to it instead."""
        statement = self.insert(table).values(values)
        return statement.on_conflict_do_update(  # type: ignore[no-any-return]
            index_elements=unique, set_=changes
        )

    def delete_chunk(
        self,
        table: sa.Table,
        key: sa.Column[Any],
        rows: sa.ColumnElement[bool],
        chunk: int,
        first: sa.ColumnElement[Any] | None,
    ) -> sa.Delete:
        """A DELETE of at most ``chunk`` of the rows ``rows`` selects (by ``key``, in
        ``first`` order when given)."""
        keys = sa.select(key).where(rows).limit(chunk)
        if first is not None:
            keys = keys.order_by(first)
        return sa.delete(table).where(key.in_(keys.scalar_subquery()), rows)

    def id_in(self, column: sa.ColumnElement[int]) -> sa.ColumnElement[bool]:
        """``column IN :ids``, the row ids bound as one list (``in_list``)."""
        return self.in_list(column, "ids", sa.BigInteger())

    @abc.abstractmethod
    def in_list(
        self, column: sa.ColumnElement[Any], name: str, kind: sa.types.TypeEngine[Any]
    ) -> sa.ColumnElement[bool]:
        """``column IN :name``, where ``name`` is bound to a list of ``kind`` values as one
        parameter: the statement's text is the same for every list, so it is compiled and
        prepared once, and the database parses one parameter instead of hundreds (an
        expanded ``IN`` is a new statement for each list length)."""

    def in_once(
        self, value: sa.ColumnElement[Any], choices: sa.Select[Any]
    ) -> sa.ColumnElement[bool]:
        """``value IN (choices)``, with ``choices`` run exactly once."""
        return value.in_(choices.scalar_subquery())

    def stored_length(self, value: sa.ColumnElement[Any]) -> sa.ColumnElement[int]:
        """A stored value's length in bytes, without reading it where the database can."""
        return sa.func.octet_length(value)

    def stored_bytes(self, value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        """A binary column's value as the claim reads it: the bytes stored."""
        return value  # a binary column holds bytes only

    @abc.abstractmethod
    def changes_table(self) -> sa.Subquery | sa.TableValuedAlias:
        """Row changes bound as parameters, as a table to join (``UPDATE ... FROM``): columns
        id, status, attempts, delay, last_error, cause, suspect (bound by ``changes_parameters``).
        One statement then changes hundreds of rows each its own way; a statement per row
        made the settle of 500 rows refused by the broker 500 statements."""

    def changes_parameters(self, changes: Sequence[Sequence[Any]]) -> dict[str, list[Any]]:
        """``changes_table``'s parameters for ``changes``, each a tuple of its columns."""
        return {"changes": [list(change) for change in changes]}

    def planner_estimate(self, conn: sa.Connection, rows: sa.Select[Any]) -> int | None:
        """The planner's estimate of the rows a one-table ``rows`` selects; None: none."""
        return None

    # The Spark writer ---------------------------------------------------------------------

    def prepare_merge(self, conn: sa.Connection) -> None:
        """Ready the transaction of a staging table's merge into the outbox."""
        return None  # nothing to set where the database's defaults serve

    def hold_stage_session(self, conn: sa.Connection) -> None:
        """Ready ``conn`` to hold a staging table's lock for a whole write."""
        return None  # nothing to set where a session's lock outlives an idle connection

    def try_stage_lock(self, conn: sa.Connection, name: str, key: tuple[int, int]) -> bool:
        """Take the staging table ``name``'s session lock (``key``: its number, where locks
        are numbered) if no one holds it; whether it did."""
        raise NotImplementedError(f"{self.name} holds no staging table locks")

    def unlock_stage(self, conn: sa.Connection, name: str, key: tuple[int, int]) -> None:
        raise NotImplementedError(f"{self.name} holds no staging table locks")

    # The sent log's rebuild (``relay.db.sentlog``), where the log is journaled ------------

    def unbounded(self, conn: sa.Connection) -> None:
        """Lift the relay session's statement and lock timeouts for the rest of ``conn``'s
        transaction, give its sorts room, and have the server end it if its relay goes away:
        the rebuild is one statement, as long as the journal needs."""
        raise NotImplementedError(f"{self.name} journals no sent log")

    def cancel(self, driver_connection: Any) -> None:
        """Cancel the statement ``driver_connection`` runs, from another thread (a rebuild's,
        when the relay stops)."""
        raise NotImplementedError(f"{self.name} journals no sent log")

    def insert_or_replace(self, table: sa.Table, key: sa.Column[Any]) -> sa.Insert:
        """An INSERT whose row replaces the one of its ``key`` if there is one; RETURNING
        gives every row it wrote, added or replaced (an ack's, ``relay.db.settles``)."""
        raise NotImplementedError(f"{self.name} journals no sent log")

    def durable_commit(self, conn: sa.Connection) -> None:
        """Have ``conn``'s transaction, in a relay session, seen by others only once its
        commit is on disk (a purge of the journal's: ``relay.db.sentlog.purge_chunk``)."""
        raise NotImplementedError(f"{self.name} journals no sent log")

    # Migrations ---------------------------------------------------------------------------

    @abc.abstractmethod
    def lock_migrations(self, conn: sa.Connection) -> None:
        """Wait for the lock of this database's migrations, and hold it while ``conn`` is
        open: one ``relay migrate`` at a time, the next reading the schema as the one before
        left it (two at once failed on the tables the first was creating)."""

    # The driver's error for a lock wait that ran out (``bound_ddl_locks``), where bounded.
    lock_timeout_error: ClassVar[type[BaseException] | None] = None

    def bound_ddl_locks(self, conn: sa.Connection) -> None:
        """Bound how long the migration's DDL on ``conn`` waits for a table's lock
        (``MIGRATION_DDL_LOCK_TIMEOUT_MS``), where a statement waiting for one holds up
        every other on the table and the migration can be tried again whole (its DDL in
        its transaction). Nothing where DDL commits as it runs: a migration stopped
        halfway would not run again."""
        return None

    # Roles and settings -------------------------------------------------------------------

    def grant(self, privileges: str, table: str, grantee: str, database: str) -> str:
        """The GRANT of ``privileges`` on ``table`` (of ``database``) to ``grantee``."""
        return f"GRANT {privileges} ON {table} TO {grantee}"

    def sequence_grants(self, grantee: str, tables: tuple[str, ...]) -> list[str]:
        """What inserting rows into ``tables`` needs besides the INSERT (their id's source)."""
        return []

    def url_problem(self, path: str, query: dict[str, list[str]]) -> str | None:
        """Why a URL with this path and query cannot hold the outbox, or None."""
        return None
