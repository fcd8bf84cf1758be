"""SQLite: the embedded default, one host and one writer at a time.

Every connection runs in WAL mode with a busy timeout; the relay's commit without a flush,
everyone else's durably. Text is read leniently (``relay.db.decode`` checks it row by row);
lists and row changes travel as one JSON array, unpacked by ``json_each``.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite
from sqlalchemy.util.concurrency import await_

from relay.constants import SQLITE_BUSY_TIMEOUT_MS
from relay.db.dialects.base import CHANGE_COLUMNS, Dialect
from relay.db.sqltext import Lexicon

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

# Every connection: WAL lets the relay read while a writer (Spark, enqueue) holds the write
# lock; the busy timeout makes writers queue instead of failing with "database is locked".
SQLITE_PRAGMAS = ("journal_mode=WAL", f"busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
# The relay's own connections (``relay_session=True``): see ``relay.db.engine``.
SQLITE_RELAY_PRAGMAS = ("synchronous=NORMAL",)
# Every other connection (writers, the inbox): a commit survives a power loss, whatever the
# build's default.
SQLITE_DURABLE = ("synchronous=FULL",)
# Where an inbox connection's pool record keeps its ``TransactionWatch``.
_WATCH = "relay_inbox_watch"
# SQLite's strftime has milliseconds (%f is SS.SSS); three zeros make SQLAlchemy's 6 digits.
_TIME_FORMAT = "'%Y-%m-%d %H:%M:%f000'"


# sqlite3's ``autocommit`` as the inbox's connections keep it (Python 3.12 and later).
_LEGACY = getattr(sqlite3, "LEGACY_TRANSACTION_CONTROL", -1)
# What a connection's session holds that the inbox's never do (``SQLite.session_left``).
_TEMPORARY = "SELECT 'the temporary ' || name FROM temp.sqlite_master LIMIT 1"


class SQLite(Dialect):
    name: ClassVar[str] = "sqlite"
    url_backends: ClassVar[tuple[str, ...]] = ("sqlite",)
    one_writer: ClassVar[bool] = True
    lenient_text: ClassVar[bool] = True
    budget_cut_as_read: ClassVar[bool] = True
    # One file, no replica to fail over to; and a text read leniently (a lone surrogate)
    # could not be bound back to find its row.
    reuses_ids: ClassVar[bool] = False
    sql_lexicon: ClassVar[Lexicon] = Lexicon(
        bracket_names=True, string_names=True, trigger_bodies=True
    )
    # A TEMP table of the inbox's name comes first in SQLite's name resolution: made through
    # the driver, the key's row copied in and the real one deleted, it was the look's, and the
    # message acked with its key not committed (an outside review).
    key_schema: ClassVar[str | None] = "main"

    def engine(
        self, url: sa.URL, *, relay_session: bool, inbox_session: bool, pre_ping: bool
    ) -> sa.Engine:
        engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
        pragmas = SQLITE_PRAGMAS + (SQLITE_RELAY_PRAGMAS if relay_session else SQLITE_DURABLE)
        sa.event.listen(engine, "connect", functools.partial(_pragmas, pragmas))
        if inbox_session:
            sa.event.listen(engine, "connect", _watch)
        return engine

    def async_engine(self, url: sa.URL) -> AsyncEngine:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(
            url.set(drivername="sqlite+aiosqlite"),
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
        )
        pragmas = functools.partial(_pragmas, SQLITE_PRAGMAS + SQLITE_DURABLE)
        sa.event.listen(engine.sync_engine, "connect", pragmas)
        sa.event.listen(engine.sync_engine, "connect", _watch)
        return engine

    def new_message_id(self) -> str:
        return "lower(hex(randomblob(16)))"

    def sent_key(self, message_id: str) -> str:
        return message_id  # the id itself

    def sent_key_value(self, message_id: str) -> str | bytes:
        return message_id

    def database_time(self, seconds: str) -> str:
        # This host's clock: an embedded database has one host (``relay.db.clock``).
        return f"strftime({_TIME_FORMAT}, 'now', printf('%.6f seconds', {seconds}))"

    def seconds_between(self, start: str, end: str) -> str:
        return f"((julianday({end}) - julianday({start})) * 86400.0)"

    def insert(self, table: sa.Table) -> Any:
        return sqlite.insert(table)

    def in_list(
        self, column: sa.ColumnElement[Any], name: str, kind: sa.types.TypeEngine[Any]
    ) -> sa.ColumnElement[bool]:
        # No arrays: the values travel as one JSON array, unpacked by json_each.
        values = sa.func.json_each(sa.bindparam(name, type_=sa.JSON())).table_valued("value")
        return column.in_(sa.select(values.c.value))

    def stored_length(self, value: sa.ColumnElement[Any]) -> sa.ColumnElement[int]:
        # SQLite 3.40 (Debian 12) has no octet_length; its ``length()`` of a BLOB is its
        # bytes, read from the record's header. Of a TEXT it is the characters before the
        # first NUL: a payload of 'a', a NUL and 20 MB was counted as 1 byte, read and
        # published past RELAY_MAX_MESSAGE_SIZE. A TEXT's bytes are its length as a BLOB
        # (the value read for it, as ``length()`` reads a TEXT to count its characters).
        # The test of its type costs a claim about 0.4 us a row (2.7 to 3.4 before; 500-row
        # claims, in process).
        # In a database whose encoding is UTF-16 that BLOB is UTF-16, and the text goes out
        # as UTF-8 (``stored_bytes``): 700 ASCII characters were counted 1,400 bytes, and
        # parked unread under a 1,000-byte largest message. Half its bytes, its UTF-16 code
        # units, are never more than its UTF-8 bytes (nor a third of them): a bound from
        # below, so that no row a message could carry is parked unread; the decoder
        # (``relay.db.decode``) parks one too large by its exact size once read.
        blob = sa.func.length(sa.cast(value, sa.LargeBinary()))
        units = sa.cast(blob / 2, sa.Integer())  # no FLOOR: SQLite may be built without it
        text = sa.case((_DATABASE_ENCODING == "UTF-8", blob), else_=units)
        return _if_text(value, text, sa.func.length(value))

    def stored_bytes(self, value: sa.ColumnElement[Any]) -> sa.ColumnElement[Any]:
        # Any column holds any storage class. A TEXT payload (plain SQL; a C writer's bytes,
        # UTF-8 or not) is read as its BLOB: the bytes stored, exactly. Decoded and encoded
        # again, a byte that was not UTF-8 went out as three others (FF as ED B3 BF).
        # Numbers stay numbers, for the decoder to refuse (``relay.db.decode``).
        # In a database whose encoding is UTF-16 a TEXT's BLOB is UTF-16 (the README's JSON
        # went out as `{\0"\0o\0...`): SQLite converted the writer's text when it stored
        # it, so the writer's bytes are gone and its text is read, for the decoder to
        # encode as UTF-8 or refuse. (The encoding is read once a statement.)
        as_stored = sa.case(
            (_DATABASE_ENCODING == "UTF-8", sa.cast(value, sa.LargeBinary())), else_=value
        )
        return _if_text(value, as_stored, value)

    def changes_table(self) -> sa.Subquery | sa.TableValuedAlias:
        # No arrays: the changes travel as one JSON array of arrays.
        each = sa.func.json_each(sa.bindparam("changes", type_=sa.JSON())).table_valued("value")
        return sa.select(
            *(
                sa.type_coerce(sa.func.json_extract(each.c.value, f"$[{i}]"), kind).label(name)
                for i, (name, kind) in enumerate(CHANGE_COLUMNS)
            )
        ).subquery("change")

    def run_lock_path(self, url: sa.URL) -> Path | None:
        return Path(f"{url.database}-inbox.lock") if url.database else None

    def changes_session(self, words: tuple[str, ...]) -> bool:
        # A PRAGMA that sets (``= value`` or ``(value)``) rather than reads.
        return words[0] == "PRAGMA" and ("=" in words or "(" in words)

    def session_changed(self, driver: Any) -> bool:
        # sqlite3's (and aiosqlite's) autocommit: no transaction begun for a statement; and
        # Python 3.12's ``autocommit`` attribute set either way (an outside review: set on
        # by a handler, the pooled connection committed the next message's key as it went
        # in). Not testable on the 3.11 this project's lock files pin.
        if getattr(driver, "isolation_level", "") is None:
            return True
        return getattr(driver, "autocommit", _LEGACY) != _LEGACY

    def outside_transaction(self, driver: Any) -> bool:
        # sqlite3 begins a transaction before an INSERT, UPDATE, DELETE or REPLACE only: a
        # `WITH ... INSERT`, a DDL statement or a SAVEPOINT sent with none open runs on its
        # own and commits. A statement can end the transaction as it fails (`INSERT OR
        # ROLLBACK`, a conflict clause's or a trigger's ROLLBACK), and a handler that caught
        # that error and wrote on had its writes committed once a retry.
        return not driver.in_transaction

    @contextmanager
    def watched(self, conn: sa.Connection) -> Iterator[None]:
        watch: TransactionWatch = conn.connection.info[_WATCH]
        watch.watching, watch.went_on = True, False
        try:
            yield
        finally:
            watch.watching = False

    def went_on(self, conn: sa.Connection) -> bool | None:
        watch: TransactionWatch = conn.connection.info[_WATCH]
        if watch.went_on:
            return True
        # The watch hears through sqlite3's one trace callback, which a handler can replace
        # through the driver (a statement log of its own): a statement it does not hear
        # says it went blind, and what ran since cannot be told. Sent on the driver's
        # connection, whatever state a refused move left SQLAlchemy's transaction in.
        watch.heard = False
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        try:
            cursor.execute("SELECT 1")
        except sqlite3.Error:
            return True  # not heard, alike
        finally:
            cursor.close()
        return not watch.heard

    def session_left(self, conn: sa.Connection) -> str | None:
        # The watch's callback set again, whatever a handler set in its place: the next
        # message's run is watched (a call on the driver's connection, no statement).
        watch: TransactionWatch = conn.connection.info[_WATCH]
        _trace(watch)
        # A temporary table of the inbox's name would come before its own in every later
        # statement on the connection (the look at a key is kept to ``main``: ``key_schema``).
        return conn.exec_driver_sql(_TEMPORARY).scalar()

    def error_facts(self, error: BaseException) -> list[str] | None:
        if not isinstance(error, sqlite3.Error):
            return None
        name = getattr(error, "sqlite_errorname", None)
        if not name:
            return []
        facts = [name]
        if name.startswith("SQLITE_CONSTRAINT"):
            # "UNIQUE constraint failed: cards.pan": the columns, never a value.
            facts.append(str(error).strip().splitlines()[0])
        return facts

    def lock_migrations(self, conn: sa.Connection) -> None:
        # The write lock, taken first (the driver begins a transaction only before a row's
        # change, so the migration's reads and DDL ran outside one): another `relay migrate`
        # waits for it at its start, for the busy timeout, and reads the schema it left.
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    def url_problem(self, path: str, query: dict[str, list[str]]) -> str | None:
        if path in ("", "/", "/:memory:") or "memory" in query.get("mode", []):
            # An in-memory database lives and dies with one connection: the relay and its
            # writers would each see an empty outbox of their own.
            return (
                "must name a database file (sqlite:///path/outbox.db): an in-memory SQLite "
                "database is not shared with the writers"
            )
        return None


# The main database's text encoding (a table-valued PRAGMA: no side effect), as a value.
_DATABASE_ENCODING = (
    sa.select(sa.literal_column("encoding")).select_from(sa.table("pragma_encoding"))
).scalar_subquery()


def _if_text(
    value: sa.ColumnElement[Any], then: sa.ColumnElement[Any], otherwise: sa.ColumnElement[Any]
) -> sa.ColumnElement[Any]:
    """``then`` where ``value`` is stored as TEXT, else ``otherwise``. (A simple CASE on a
    literal: a searched one with the type bound as a parameter cost the claim 0.2 us a row
    more.)"""
    return sa.case(
        {sa.literal_column("'text'"): then}, value=sa.func.typeof(value), else_=otherwise
    )


def _pragmas(pragmas: tuple[str, ...], dbapi_connection: Any, _record: Any) -> None:
    # SQLite keeps whatever bytes a writer put in a TEXT value, and Python's sqlite3 fails the
    # whole fetch on one that is not UTF-8 (a routing key written by a C program, or
    # CAST(X'FF41' AS TEXT)): one such row stopped every claim. Read leniently instead, the
    # bytes that are not UTF-8 kept as lone surrogates, for the row's decoder to refuse by
    # name (``relay.db.decode``).
    # (aiosqlite's connection under SQLAlchemy's adapter takes it as sqlite3's does.)
    driver = getattr(dbapi_connection, "driver_connection", None) or dbapi_connection
    driver.text_factory = _lenient_text
    cursor = dbapi_connection.cursor()
    for pragma in pragmas:
        cursor.execute(f"PRAGMA {pragma}")
    cursor.close()


class TransactionWatch:
    """Whether an inbox connection ran a statement outside a transaction while a handler's run
    was watched (``SQLite.watched``), told of each statement the connection runs, the
    driver's own and a trigger's too (sqlite3's trace callback). After the message's
    transaction ended, whatever ran next ran outside it (a BEGIN, or a statement committed as
    it ran): ``went_on`` says so; a run whose transaction ended with nothing after it has
    nothing committed past it."""

    __slots__ = ("driver", "heard", "watching", "went_on")

    def __init__(self, driver: Any) -> None:
        self.driver = driver  # sqlite3's connection, or aiosqlite's (its in_transaction alike)
        self.watching = False
        self.went_on = False
        self.heard = False  # any statement, watched or not (``SQLite.went_on``)

    def traced(self, _statement: str) -> None:
        self.heard = True
        if self.watching and not self.driver.in_transaction:
            self.went_on = True


def _watch(dbapi_connection: Any, record: Any) -> None:
    """An inbox connection's ``TransactionWatch``, kept in its pool record."""
    driver = getattr(dbapi_connection, "driver_connection", None) or dbapi_connection
    watch = record.info[_WATCH] = TransactionWatch(driver)
    _trace(watch)


def _trace(watch: TransactionWatch) -> None:
    """``watch`` told of each statement its connection runs (sqlite3's trace callback)."""
    if isinstance(watch.driver, sqlite3.Connection):
        watch.driver.set_trace_callback(watch.traced)
    else:  # aiosqlite's, whose connection is used on a thread of its own
        await_(watch.driver.set_trace_callback(watch.traced))


def _lenient_text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


DIALECT = SQLite()
