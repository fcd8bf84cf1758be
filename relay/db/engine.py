"""Engines for the outbox database, and the error wrapping every database call shares.

Two kinds of session, by what their writes must survive:

- ``relay_session=True`` (the relay's claims, settles, turns, probe and purges):
  ``synchronous_commit=off`` on PostgreSQL, ``synchronous=NORMAL`` on SQLite (in WAL mode:
  no fsync at commit, only at checkpoints). A claim or settle lost in a database or machine
  crash only makes rows due again, so they are published twice, never lost; not waiting for
  the flush takes a disk flush off every batch. And bounded, so that a relay that froze or
  vanished holds nothing for long: the server ends a statement that runs, or waits for a
  lock, too long, and a transaction left idle (``DB_*`` in ``relay.constants``); TCP
  keepalives on both ends find a silent peer in seconds.
- ``inbox_session=True`` (an inbox consumer's, its handlers' writes among them): durable, as
  below, and bounded where a wait is never a handler's own work: a lock waited for
  (another consumer's handler of the same id) and a statement run longer than the relay's
  limits fail, instead of holding a delivery and its connection indefinitely. No limit on
  an idle transaction: a handler may call out between its statements.
- the default (writers, operators, migrations, the Spark writer's merge, the inbox):
  durable commits whatever the server's default (``synchronous_commit=on`` on PostgreSQL,
  ``synchronous=FULL`` on SQLite). A message a writer was told is in the outbox must be
  there after a crash, and a message an inbox acked must stay processed (on a server set to
  ``synchronous_commit=off``, a crash lost 6 of 3,000 messages an inbox had acked). TCP
  keepalives here too.

Writers' and operators' engines test a pooled connection before using it (``pre_ping``):
they make a call now and then, and a connection the database dropped meanwhile would fail
it. The relay's and the inbox's do not: their connections are busy, a dropped one fails one
call, which is retried (SQLAlchemy then discards every pooled connection of that age), and a
test query per call was a round trip on every claim, settle and delivery.

MySQL and MariaDB (URLs ``mysql://``, ``mariadb://``; the driver is mysqlclient, the C
client SQLAlchemy also defaults to): every session runs in UTC (``relay.db.clock``) and in
strict mode (a value too long for its column fails its statement, never truncated); the
relay's own read committed, with lock and statement timeouts. A server older than
``MARIADB_MIN_VERSION`` / ``MYSQL_MIN_VERSION`` is refused at connect (``ConfigError``: no
retry makes it work). MySQL's durability is the server's (``innodb_flush_log_at_trx_commit``
has no per-session setting), so relay sessions there commit durably too.
"""

from __future__ import annotations

import functools
import itertools
import os
import re
import socket
import struct
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.adapt
import psycopg.postgres
import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql

from relay.constants import (
    DB_CONNECT_TIMEOUT_S,
    DB_IDLE_IN_TRANSACTION_S,
    DB_KEEPALIVE_COUNT,
    DB_KEEPALIVE_IDLE_S,
    DB_KEEPALIVE_INTERVAL_S,
    DB_LOCK_TIMEOUT_MS,
    DB_STATEMENT_TIMEOUT_MS,
    DB_TCP_USER_TIMEOUT_S,
    MARIADB_MIN_VERSION,
    MYSQL_MIN_VERSION,
    SQLITE_BUSY_TIMEOUT_MS,
)
from relay.errors import ConfigError, SchemaMissingError, StoreError
from relay.redact import redact_url

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

# The relay's own PostgreSQL session settings (``relay_session=True``), each for a reason:
RELAY_SESSION_SETTINGS = {
    # Bounded: see the module docstring and the constants.
    "statement_timeout": str(DB_STATEMENT_TIMEOUT_MS),
    "lock_timeout": str(DB_LOCK_TIMEOUT_MS),
    "idle_in_transaction_session_timeout": str(DB_IDLE_IN_TRANSACTION_S * 1000),
    "tcp_keepalives_idle": str(DB_KEEPALIVE_IDLE_S),
    "tcp_keepalives_interval": str(DB_KEEPALIVE_INTERVAL_S),
    "tcp_keepalives_count": str(DB_KEEPALIVE_COUNT),
    # Right after a bulk load (a Spark job's million rows) the table's statistics still say
    # "few pending rows", and the planner then picks a bitmap scan of *every* due row plus a
    # sort for each claim of 500 (measured: 50 ms instead of 9 ms at 60k due rows). Without
    # bitmap scans the claim walks the partial index in order and stops at its LIMIT; the
    # relay's other statements are primary-key lookups, which this does not affect.
    "enable_bitmapscan": "off",
    # psycopg prepares a statement run five times, and PostgreSQL may then switch to one
    # generic plan, made with the statistics of that moment: a relay that idled on an empty
    # outbox kept a plan fit for an empty table, and when a bulk load arrived one claim took
    # over 30 s (the statement timeout) instead of a few ms (seen in bench.run). Custom plans
    # are made per execution with the table's current size; parsing is still saved.
    "plan_cache_mode": "force_custom_plan",
    # See the module docstring.
    "synchronous_commit": "off",
}
APPLICATION_NAME = "outbox-relay"
# An execution option: the statement's results in PostgreSQL's binary format (see
# ``_binary_results``).
BINARY_RESULTS = "outbox_binary_results"
# Every SQLite connection: WAL lets the relay read while a writer (Spark, enqueue) holds the
# write lock; the busy timeout makes writers queue instead of failing with "database is
# locked".
SQLITE_PRAGMAS = ("journal_mode=WAL", f"busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
# The relay's own SQLite connections (``relay_session=True``): see the module docstring.
SQLITE_RELAY_PRAGMAS = ("synchronous=NORMAL",)
# Every other connection (writers, the inbox): a commit survives a power loss, whatever the
# build's default.
SQLITE_DURABLE = ("synchronous=FULL",)
# Every MySQL session: UTC, and strict for every table (a session may start non-strict).
MYSQL_SESSION = "SET time_zone = '+00:00', sql_mode = CONCAT(@@sql_mode, ',STRICT_ALL_TABLES')"
# The relay's own sessions, bounded (see the module docstring): row and table locks waited for
# in seconds; MariaDB counts its statement limit in seconds and ends idle transactions, MySQL
# counts its statement limit in milliseconds (of SELECTs only) and has no idle limit.
_LOCK_WAIT_S = DB_LOCK_TIMEOUT_MS // 1000
_LOCK_WAITS = f"innodb_lock_wait_timeout = {_LOCK_WAIT_S}, lock_wait_timeout = {_LOCK_WAIT_S}"
MARIADB_RELAY_SESSION = (
    f"SET {_LOCK_WAITS}, max_statement_time = {DB_STATEMENT_TIMEOUT_MS // 1000}, "
    f"idle_transaction_timeout = {DB_IDLE_IN_TRANSACTION_S}"
)
MYSQL_RELAY_SESSION = f"SET {_LOCK_WAITS}, max_execution_time = {DB_STATEMENT_TIMEOUT_MS}"
# An inbox's sessions (``inbox_session=True``): lock waits and statements bounded as the
# relay's, no idle limit (see the module docstring).
INBOX_SESSION_SETTINGS = {
    "statement_timeout": str(DB_STATEMENT_TIMEOUT_MS),
    "lock_timeout": str(DB_LOCK_TIMEOUT_MS),
}
MARIADB_INBOX_SESSION = f"SET {_LOCK_WAITS}, max_statement_time = {DB_STATEMENT_TIMEOUT_MS // 1000}"
MYSQL_INBOX_SESSION = MYSQL_RELAY_SESSION
# libpq's keepalives and its timeout for unacknowledged data (see the module docstring).
PG_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": DB_KEEPALIVE_IDLE_S,
    "keepalives_interval": DB_KEEPALIVE_INTERVAL_S,
    "keepalives_count": DB_KEEPALIVE_COUNT,
    "tcp_user_timeout": DB_TCP_USER_TIMEOUT_S * 1000,
}
MYSQL_BACKENDS = ("mysql", "mariadb")


def create_engine(
    url: str, *, relay_session: bool = False, inbox_session: bool = False, pre_ping: bool = True
) -> sa.Engine:
    """An engine for ``url`` with durable sessions; with ``relay_session``, with the session
    settings the relay's own claims and settles want; with ``inbox_session``, an inbox's;
    ``pre_ping``, testing a pooled connection before each use, where ``relay_session`` is off
    (see the module docstring)."""
    pre_ping = pre_ping and not relay_session
    parsed = _url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() in MYSQL_BACKENDS:
        url_, connect_args, options = _mysql_options(parsed, relay_session)
        engine = sa.create_engine(
            url_, pool_pre_ping=pre_ping, connect_args=connect_args, **options
        )
        session = functools.partial(_mysql_session, relay_session, inbox_session)
        sa.event.listen(engine, "connect", session)
        return engine
    if parsed.get_backend_name() == "postgresql":
        connect_args = _pg_connect_args(relay_session, inbox_session)
        engine = sa.create_engine(parsed, pool_pre_ping=pre_ping, connect_args=connect_args)
        sa.event.listen(engine, "before_cursor_execute", _binary_results)
        sa.event.listen(engine, "connect", _register_dumpers)
        return engine
    engine = sa.create_engine(parsed, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000})
    pragmas = SQLITE_PRAGMAS + (SQLITE_RELAY_PRAGMAS if relay_session else SQLITE_DURABLE)
    sa.event.listen(engine, "connect", functools.partial(_sqlite_pragmas, pragmas))
    return engine


def create_async_engine(url: str) -> AsyncEngine:
    """An asyncio engine for ``url`` with an inbox's sessions (``inbox_session``), on the
    drivers' asyncio flavours: psycopg's own for PostgreSQL, aiomysql for MySQL and MariaDB,
    aiosqlite for SQLite (the ``asyncio`` extra). The session settings are the blocking
    engine's, applied through SQLAlchemy's adapters to the same events."""
    # Here, not at the top: SQLAlchemy's asyncio needs greenlet, which the relay itself
    # does without (it comes with the ``asyncio`` extra).
    from sqlalchemy.ext.asyncio import create_async_engine as create_asyncio_engine

    parsed = _url(url)
    backend = parsed.get_backend_name()
    if backend in MYSQL_BACKENDS:
        url_, connect_args, options = _mysql_options(parsed.set(drivername="mysql+aiomysql"), False)
        engine = create_asyncio_engine(url_, connect_args=connect_args, **options)
        session = functools.partial(_mysql_session, False, True)
        sa.event.listen(engine.sync_engine, "connect", session)
        return engine
    if backend == "postgresql":
        connect_args = _pg_connect_args(relay_session=False, inbox_session=True)
        return create_asyncio_engine(
            parsed.set(drivername="postgresql+psycopg"), connect_args=connect_args
        )
    engine = create_asyncio_engine(
        parsed.set(drivername="sqlite+aiosqlite"),
        connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
    )
    pragmas = functools.partial(_sqlite_pragmas, SQLITE_PRAGMAS + SQLITE_DURABLE)
    sa.event.listen(engine.sync_engine, "connect", pragmas)
    return engine


def _url(url: str) -> sa.URL:
    try:
        return sa.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise StoreError(f"database URL {redact_url(url)!r} is not valid: {exc}") from exc


def _pg_connect_args(relay_session: bool, inbox_session: bool) -> dict[str, Any]:
    settings = (
        RELAY_SESSION_SETTINGS
        if relay_session
        # Durable whatever the server's default: a writer's or an inbox's commit is a
        # promise (an inbox acks its message after it).
        else {"synchronous_commit": "on", **(INBOX_SESSION_SETTINGS if inbox_session else {})}
    )
    connect_args: dict[str, Any] = {
        "connect_timeout": DB_CONNECT_TIMEOUT_S,
        **PG_KEEPALIVES,
        "options": " ".join(f"-c {name}={value}" for name, value in settings.items()),
    }
    if relay_session:
        connect_args["application_name"] = APPLICATION_NAME
    return connect_args


def _mysql_options(
    url: sa.URL, relay_session: bool
) -> tuple[sa.URL, dict[str, Any], dict[str, Any]]:
    """MySQL and MariaDB: one dialect name (``mysql``) whichever the URL says, utf8mb4: the
    URL, the driver's connect arguments, the engine's options."""
    url = url.set(drivername=f"mysql+{url.get_driver_name() or 'mysqldb'}")
    url = url.update_query_dict({"charset": "utf8mb4"})
    # No CLIENT_FOUND_ROWS (SQLAlchemy sets it for its ORM): a statement's row count is then the
    # rows it changed, so an insert that skips message ids already there counts what it added.
    connect_args: dict[str, Any] = {"connect_timeout": DB_CONNECT_TIMEOUT_S, "client_flag": 0}
    options: dict[str, Any] = {"isolation_level": "READ COMMITTED"} if relay_session else {}
    return url, connect_args, options


def _mysql_session(
    relay_session: bool, inbox_session: bool, dbapi_connection: Any, _record: Any
) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("SELECT VERSION()")
    server = str(cursor.fetchone()[0])
    problem = server_version_problem(server)
    if problem is not None:
        raise ConfigError(problem)
    cursor.execute(MYSQL_SESSION)
    mariadb = "mariadb" in server.lower()
    if relay_session:
        cursor.execute(MARIADB_RELAY_SESSION if mariadb else MYSQL_RELAY_SESSION)
    elif inbox_session:
        cursor.execute(MARIADB_INBOX_SESSION if mariadb else MYSQL_INBOX_SESSION)
    if relay_session or inbox_session:
        fileno = getattr(dbapi_connection, "fileno", None)
        if fileno is not None:  # aiomysql's adapter has none: its keepalive is the server's
            keep_alive(fileno())
    cursor.close()


def keep_alive(fd: int) -> None:
    """TCP keepalives and a timeout for unacknowledged data on the socket ``fd`` (a unix
    socket is left as it is): what libpq sets from its parameters, set here where the driver
    (mysqlclient) has no parameter for it."""
    with socket.socket(fileno=os.dup(fd)) as sock:
        if sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, DB_KEEPALIVE_IDLE_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, DB_KEEPALIVE_INTERVAL_S)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, DB_KEEPALIVE_COUNT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, DB_TCP_USER_TIMEOUT_S * 1000)


def server_version_problem(server: str) -> str | None:
    """Why a MySQL-family server announcing itself as ``server`` (its version string) cannot
    hold the outbox, or None."""
    found = re.match(r"(?:5\.5\.5-)?(\d+)\.(\d+)\.(\d+)", server)
    if found is None:
        return f"the database server's version {server!r} is not one of MySQL or MariaDB's"
    version = tuple(int(part) for part in found.groups())
    mariadb = "mariadb" in server.lower()
    floor = MARIADB_MIN_VERSION if mariadb else MYSQL_MIN_VERSION
    if version < floor:
        name = "MariaDB" if mariadb else "MySQL"
        shown = ".".join(map(str, version))
        return (
            f"{name} {shown} cannot hold the outbox: it needs {name} "
            f"{'.'.join(map(str, floor))} or later (FOR UPDATE SKIP LOCKED, JSON_TABLE)"
        )
    return None


def _binary_results(
    _conn: sa.Connection,
    cursor: Any,
    _statement: str,
    _parameters: Any,
    context: Any,
    _executemany: bool,
) -> None:
    """A statement run with the ``BINARY_RESULTS`` execution option gets its results in
    binary: a payload comes as its bytes, not as hex text twice as long that the server
    encodes and the driver decodes (a claim of 1.5 MiB payloads spent most of the relay's
    CPU in that). SQLAlchemy makes a cursor per statement, so no other statement sees it."""
    if context is not None and context.execution_options.get(BINARY_RESULTS):
        cursor.format = psycopg.pq.Format.BINARY


def _sqlite_pragmas(pragmas: tuple[str, ...], dbapi_connection: Any, _record: Any) -> None:
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


def _lenient_text(value: bytes) -> str:
    return value.decode("utf-8", "surrogateescape")


@contextmanager
def db_errors(what: str, where: str) -> Iterator[None]:
    """Turn the driver's errors into StoreError (chained), naming the call and the database."""
    try:
        yield
    except sa.exc.DBAPIError as exc:
        if _missing_table(exc):
            raise schema_missing(where, _missing_table_name(exc)) from exc
        first_line = str(exc.orig).strip().splitlines()[0] if str(exc.orig).strip() else ""
        raise StoreError(
            f"{what} on {where} failed: {type(exc.orig).__name__}: {first_line}"
        ) from exc
    except sa.exc.SQLAlchemyError as exc:
        raise StoreError(f"{what} on {where} failed: {exc}") from exc


@contextmanager
def transaction(engine: sa.Engine, what: str, where: str) -> Iterator[sa.Connection]:
    """One transaction on ``engine``; the driver's errors become StoreError naming ``where``
    (the database as the user wrote it, password redacted)."""
    with db_errors(what, where), engine.begin() as conn:
        yield conn


def in_chunks(
    engine: sa.Engine,
    one_chunk: Callable[[sa.Connection], int],
    *,
    chunk: int,
    what: str,
    where: str,
    stop: threading.Event | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """``one_chunk`` (which deletes at most ``chunk`` rows, and says how many) in a
    transaction of its own, again and again until it deletes fewer; returns how many in all.
    ``progress`` is told the total after each full chunk; a set ``stop`` ends it after the
    chunk under way."""
    deleted = 0
    while stop is None or not stop.is_set():
        with transaction(engine, what, where) as conn:
            count = one_chunk(conn)
        deleted += count
        if count < chunk:
            break
        if progress is not None:
            progress(deleted)
    return deleted


def run_delete(delete: sa.Delete, conn: sa.Connection) -> int:
    """``delete`` on ``conn``; the rows it deleted (a chunk for ``in_chunks``)."""
    return int(conn.execute(delete).rowcount)


def delete_chunk(
    table: sa.Table,
    key: sa.Column[Any],
    rows: sa.ColumnElement[bool],
    *,
    chunk: int,
    dialect: sa.Dialect,
    first: sa.ColumnElement[Any] | None = None,
) -> sa.Delete:
    """A DELETE of at most ``chunk`` of the rows of ``table`` that ``rows`` selects (by
    ``key``, and in ``first`` order when given): MySQL limits a DELETE itself, and takes no
    LIMIT in an IN subquery."""
    if dialect.name == "mysql":
        return sa.delete(table).where(rows).with_dialect_options(mysql_limit=chunk)
    keys = sa.select(key).where(rows).limit(chunk)
    if first is not None:
        keys = keys.order_by(first)
    return sa.delete(table).where(key.in_(keys.scalar_subquery()), rows)


def insert_or_ignore(table: sa.Table, dialect: sa.Dialect) -> sa.Insert:
    """An INSERT into ``table`` that skips a row whose key is there already, with the
    database's own: ``INSERT IGNORE`` on MySQL (which would also truncate a value too long for
    its column: the callers insert none), ``ON CONFLICT DO NOTHING`` elsewhere. Its row count
    is the rows it added."""
    if dialect.name == "mysql":
        return mysql.insert(table).prefix_with("IGNORE")
    return postgresql.insert(table).on_conflict_do_nothing()


def in_list(
    column: sa.ColumnElement[Any], name: str, kind: sa.types.TypeEngine[Any], dialect: sa.Dialect
) -> sa.ColumnElement[bool]:
    """``column IN :name``, where ``name`` is bound to a list of ``kind`` values as one
    parameter: the statement's text is the same for every list, so it is compiled and prepared
    once, and the database parses one parameter instead of hundreds (an expanded ``IN`` is a
    new statement for each list length)."""
    if dialect.name == "postgresql":
        # Any whole numbers as one binary bigint[] (``_Int8sDumper``): a claim's 32 buckets
        # as a smallint[] took psycopg's list dumper a regular expression each.
        integers = isinstance(kind, sa.Integer)
        array = _BigIntArray() if integers else postgresql.ARRAY(kind)
        return column == sa.any_(sa.bindparam(name, type_=array))
    if dialect.name == "mysql":
        # A list of values, written into the statement: its driver prepares nothing, and
        # MariaDB reads ``IN (1, 2, ...)`` as index lookups, but runs ``IN (subquery)`` of an
        # UPDATE or DELETE once per row of the table (acks cost 1.6 ms of its CPU a row).
        return column.in_(sa.bindparam(name, type_=kind, expanding=True))
    # SQLite has no arrays: the values travel as one JSON array, unpacked by json_each.
    values = sa.func.json_each(sa.bindparam(name, type_=sa.JSON())).table_valued("value")
    return column.in_(sa.select(values.c.value))


class _Int8s(tuple[int, ...]):
    """Ids bound on PostgreSQL as one ``bigint[]`` (``in_list``), by ``_Int8sDumper``."""


_INT8 = psycopg.postgres.types["int8"]
_ARRAY_HEADER = struct.Struct(">iiIii")  # dimensions, has nulls, element type; size, lower bound
_INT8_ELEMENT = struct.Struct(">iq")  # an element's length (8), its value


class _Int8sDumper(psycopg.adapt.Dumper):
    """A ``bigint[]`` in PostgreSQL's binary array format, each element packed by one C call:
    psycopg's own list dumper takes each element through Python, with a regular expression
    in text format, and was most of a settle's own CPU (about 1 us an acked row)."""

    format = psycopg.pq.Format.BINARY
    oid = _INT8.array_oid

    def dump(self, obj: Sequence[int]) -> bytes:
        header = _ARRAY_HEADER.pack(1, 0, _INT8.oid, len(obj), 1)
        return header + b"".join(map(_INT8_ELEMENT.pack, itertools.repeat(8), obj))


class _BigIntArray(sa.types.UserDefinedType[Sequence[int]]):
    """``bigint[]`` for a bound list of ids, dumped by ``_Int8sDumper`` (registered on every
    connection of ``create_engine``'s PostgreSQL engines)."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "BIGINT[]"

    def bind_processor(
        self, dialect: sa.Dialect
    ) -> Callable[[Sequence[int] | None], _Int8s | None]:
        return lambda ids: None if ids is None else _Int8s(ids)


def _register_dumpers(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.adapters.register_dumper(_Int8s, _Int8sDumper)


def id_in(column: sa.ColumnElement[int], dialect: sa.Dialect) -> sa.ColumnElement[bool]:
    """``column IN :ids``, the row ids bound as one list (``in_list``)."""
    return in_list(column, "ids", sa.BigInteger(), dialect)


# A row change's fields, as ``changes_table`` binds them (``relay.records.RowChange``'s).
_CHANGE_COLUMNS: tuple[tuple[str, sa.types.TypeEngine[Any]], ...] = (
    ("id", sa.BigInteger()),
    ("status", sa.Text()),
    ("attempts", sa.Integer()),
    ("delay", sa.Float()),
    ("last_error", sa.Text()),
    ("suspect", sa.Boolean()),
)


# JSON_TABLE's column types where the column's own type's name is not one: text of any length.
_JSON_TABLE_TYPES = {"status": "VARCHAR(16)", "last_error": "TEXT"}


def changes_table(dialect: sa.Dialect) -> sa.Subquery | sa.TableValuedAlias:
    """Row changes bound as parameters, as a table to join (``UPDATE ... FROM``): columns
    id, status, attempts, delay, last_error, suspect (bind them with ``changes_parameters``). One
    statement then changes hundreds of rows each its own way; a statement per row made the
    settle of 500 rows refused by the broker 500 statements."""
    if dialect.name == "postgresql":
        arrays = [
            sa.bindparam(f"change_{name}", type_=postgresql.ARRAY(kind))
            for name, kind in _CHANGE_COLUMNS
        ]
        columns = [sa.column(name, kind) for name, kind in _CHANGE_COLUMNS]
        return sa.func.unnest(*arrays).table_valued(*columns).render_derived("change")
    if dialect.name == "mysql":
        # One JSON array of arrays, a table by JSON_TABLE (see ``in_list``).
        columns_sql = ", ".join(
            f"{name} {_JSON_TABLE_TYPES.get(name, kind.compile(dialect=dialect))} PATH '$[{i}]'"
            for i, (name, kind) in enumerate(_CHANGE_COLUMNS)
        )
        table = sa.text(f"SELECT * FROM JSON_TABLE(:changes, '$[*]' COLUMNS ({columns_sql})) AS c")
        typed = table.bindparams(sa.bindparam("changes", type_=sa.JSON())).columns(
            *(sa.column(name, kind) for name, kind in _CHANGE_COLUMNS)
        )
        return typed.subquery("change")
    # SQLite has no arrays: the changes travel as one JSON array of arrays.
    each = sa.func.json_each(sa.bindparam("changes", type_=sa.JSON())).table_valued("value")
    return sa.select(
        *(
            sa.type_coerce(sa.func.json_extract(each.c.value, f"$[{i}]"), kind).label(name)
            for i, (name, kind) in enumerate(_CHANGE_COLUMNS)
        )
    ).subquery("change")


def changes_parameters(
    dialect: sa.Dialect, changes: Sequence[Sequence[Any]]
) -> dict[str, list[Any]]:
    """``changes_table``'s parameters for ``changes``, each a tuple of its columns."""
    if dialect.name == "postgresql":
        return {
            f"change_{name}": [change[i] for change in changes]
            for i, (name, _kind) in enumerate(_CHANGE_COLUMNS)
        }
    return {"changes": [list(change) for change in changes]}


def bounded_count(conn: sa.Connection, rows: sa.Select[Any], exact_upto: int) -> int:
    """How many rows ``rows`` selects: counted up to ``exact_upto`` (a count stops there),
    estimated beyond by the database's planner (never below the count; SQLite has no
    estimate). ``count(*)`` of a 1M-row backlog took 279 ms; this takes a few ms at any size."""
    bounded = sa.select(sa.func.count()).select_from(rows.limit(exact_upto + 1).subquery())
    count = int(conn.execute(bounded).scalar_one())
    if count > exact_upto and conn.dialect.name != "sqlite":
        count = max(count, _planner_estimate(conn, rows))
    return count


def _planner_estimate(conn: sa.Connection, rows: sa.Select[Any]) -> int:
    """The planner's estimate of the rows a one-table ``rows`` selects: PostgreSQL's from
    the table's statistics; MySQL's from dives into the index whose range it reads."""
    sql = rows.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
    if conn.dialect.name == "postgresql":
        (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sql}").scalar_one()
        return int(plan["Plan"]["Plan Rows"])
    plan_row = conn.exec_driver_sql(f"EXPLAIN {sql}").mappings().one()
    return int(plan_row["rows"] or 0)


def schema_missing(where: str, table: str = "outbox") -> SchemaMissingError:
    return SchemaMissingError(f"the {table} table does not exist in {where}: run `relay migrate`")


# MySQL's error number for "table doesn't exist".
_MYSQL_NO_SUCH_TABLE = 1146


def _missing_table_name(exc: sa.exc.DBAPIError) -> str:
    """The table the driver's error names (PostgreSQL: relation "t"; SQLite: no such
    table: t; MySQL: Table 'db.t'), or "outbox"."""
    found = re.search(
        r"""relation "(\w+)"|no such table: (\w+)|Table '\w+\.(\w+)'""", str(exc.orig)
    )
    return next((name for name in found.groups() if name), "outbox") if found else "outbox"


def _missing_table(exc: sa.exc.DBAPIError) -> bool:
    if getattr(exc.orig, "sqlstate", None) == "42P01" or "no such table" in str(exc.orig):
        return True
    args: tuple[Any, ...] = getattr(exc.orig, "args", ())
    return len(args) > 0 and args[0] == _MYSQL_NO_SUCH_TABLE
