"""MySQL and MariaDB (mysqlclient, the C client SQLAlchemy also defaults to; aiomysql for
asyncio): one dialect, ``mysql``, whichever the URL names.

Every session runs in UTC (``relay.db.clock``) and in strict mode (a value too long for its
column fails its statement, never truncated); the relay's own in read committed, with lock
and statement timeouts. A server older than ``MARIADB_MIN_VERSION`` / ``MYSQL_MIN_VERSION``
is refused at connect (``ConfigError``: no retry makes it work). MySQL's durability is the
server's (``innodb_flush_log_at_trx_commit`` has no per-session setting), so the relay's
sessions commit durably too. Lists are written into the statement and row changes bound as
one JSON array read by ``JSON_TABLE``; a DELETE takes its own LIMIT; no partial indexes.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import socket
from typing import TYPE_CHECKING, Any, ClassVar

import sqlalchemy as sa
from sqlalchemy.dialects import mysql

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
    MIGRATION_LOCK_WAIT_S,
    MYSQL_MIN_VERSION,
    SPARK_STAGE_LOCK_WAIT_TIMEOUT_S,
)
from relay.db.dialects.base import CHANGE_COLUMNS, Dialect
from relay.db.dialects.mysql_inbox import MySQLInbox
from relay.errors import ConfigError, StoreError

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

# Every session: UTC, and strict for every table (a session may start non-strict).
MYSQL_SESSION = "SET time_zone = '+00:00', sql_mode = CONCAT(@@sql_mode, ',STRICT_ALL_TABLES')"
# The relay's own sessions, bounded (see ``relay.db.engine``): row and table locks waited for
# in seconds; MariaDB counts its statement limit in seconds and ends idle transactions, MySQL
# counts its statement limit in milliseconds (of SELECTs only) and has no idle limit.
_LOCK_WAIT_S = DB_LOCK_TIMEOUT_MS // 1000
_LOCK_WAITS = f"innodb_lock_wait_timeout = {_LOCK_WAIT_S}, lock_wait_timeout = {_LOCK_WAIT_S}"
MARIADB_RELAY_SESSION = (
    f"SET {_LOCK_WAITS}, max_statement_time = {DB_STATEMENT_TIMEOUT_MS // 1000}, "
    f"idle_transaction_timeout = {DB_IDLE_IN_TRANSACTION_S}"
)
MYSQL_RELAY_SESSION = f"SET {_LOCK_WAITS}, max_execution_time = {DB_STATEMENT_TIMEOUT_MS}"
# An inbox's sessions: lock waits and statements bounded as the relay's, no idle limit.
MARIADB_INBOX_SESSION = f"SET {_LOCK_WAITS}, max_statement_time = {DB_STATEMENT_TIMEOUT_MS // 1000}"
MYSQL_INBOX_SESSION = MYSQL_RELAY_SESSION
# JSON_TABLE's column types where the column's own type's name is not one: text of any length.
_JSON_TABLE_TYPES = {"status": "VARCHAR(16)", "last_error": "TEXT", "cause": "TEXT"}


class MySQL(MySQLInbox, Dialect):
    name: ClassVar[str] = "mysql"
    url_backends: ClassVar[tuple[str, ...]] = ("mysql", "mariadb")
    claims_carry_ids: ClassVar[bool] = True
    partial_indexes: ClassVar[bool] = False
    stage_locks: ClassVar[bool] = True

    def engine(
        self, url: sa.URL, *, relay_session: bool, inbox_session: bool, pre_ping: bool
    ) -> sa.Engine:
        url_, connect_args, options = _options(url, relay_session)
        engine = sa.create_engine(
            url_, pool_pre_ping=pre_ping, connect_args=connect_args, **options
        )
        sa.event.listen(
            engine, "connect", functools.partial(_session, relay_session, inbox_session)
        )
        return engine

    def async_engine(self, url: sa.URL) -> AsyncEngine:
        from sqlalchemy.ext.asyncio import create_async_engine

        url_, connect_args, options = _options(url.set(drivername="mysql+aiomysql"), False)
        engine = create_async_engine(url_, connect_args=connect_args, **options)
        sa.event.listen(engine.sync_engine, "connect", functools.partial(_session, False, True))
        return engine

    def autocommit(self, engine: sa.Engine) -> sa.Engine:
        # mysqlclient sends no BEGIN anyway, and switching autocommit is a round trip at each
        # checkout: the engine as it is.
        return engine

    def short_text(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any]:
        # VARCHAR(255) in the server's NO PAD binary collation (``no_pad_collation``).
        return mysql.VARCHAR(255, collation=no_pad_collation(dialect))

    def utc_datetime(self, dialect: sa.Dialect) -> sa.types.TypeEngine[Any] | None:
        return mysql.DATETIME(fsp=6)  # UTC: its sessions' time zone is UTC

    def index_columns(self, columns: list[str]) -> list[str]:
        # No partial indexes: every row pays for every index, led by the status.
        return ["status", *columns]

    def new_message_id(self) -> str:
        return "(uuid())"  # an expression default is written in parentheses

    def stored_now(self, now: str) -> str:
        # UTC with microseconds (its ``now()`` is the session's zone, in whole seconds).
        return "(utc_timestamp(6))"

    def sent_key(self, message_id: str) -> str:
        return f"unhex(md5({message_id}))"

    def sent_key_value(self, message_id: str) -> str | bytes:
        return hashlib.md5(message_id.encode()).digest()

    def database_time(self, seconds: str) -> str:
        return f"timestampadd(MICROSECOND, round({seconds} * 1000000), utc_timestamp(6))"

    def seconds_between(self, start: str, end: str) -> str:
        return f"(timestampdiff(MICROSECOND, {start}, {end}) / 1e6)"  # a double, not a decimal

    def insert(self, table: sa.Table) -> Any:
        return mysql.insert(table)

    def insert_or_ignore(self, table: sa.Table) -> sa.Insert:
        # INSERT IGNORE would also truncate a value too long for its column: the callers
        # insert none.
        return mysql.insert(table).prefix_with("IGNORE")

    def skip_duplicates(self, statement: Any, table: sa.Table, unique: list[str]) -> sa.Insert:
        # ON DUPLICATE KEY UPDATE of nothing (the key to itself): not INSERT IGNORE, which
        # would also turn a value too long for its column into a truncated one.
        (key,) = table.primary_key.columns
        return statement.on_duplicate_key_update({key.name: key})  # type: ignore[no-any-return]

    def upsert(
        self, table: sa.Table, values: dict[str, Any], unique: list[str], changes: dict[str, Any]
    ) -> sa.Insert:
        return mysql.insert(table).values(values).on_duplicate_key_update(changes)

    def delete_chunk(
        self,
        table: sa.Table,
        key: sa.Column[Any],
        rows: sa.ColumnElement[bool],
        chunk: int,
        first: sa.ColumnElement[Any] | None,
    ) -> sa.Delete:
        # A DELETE limits itself here, and takes no LIMIT in an IN subquery.
        return sa.delete(table).where(rows).with_dialect_options(mysql_limit=chunk)

    def in_list(
        self, column: sa.ColumnElement[Any], name: str, kind: sa.types.TypeEngine[Any]
    ) -> sa.ColumnElement[bool]:
        # A list of values, written into the statement: its driver prepares nothing, and
        # MariaDB reads ``IN (1, 2, ...)`` as index lookups, but runs ``IN (subquery)`` of an
        # UPDATE or DELETE once per row of the table (acks cost 1.6 ms of its CPU a row).
        return column.in_(sa.bindparam(name, type_=kind, expanding=True))

    def changes_table(self) -> sa.Subquery | sa.TableValuedAlias:
        # One JSON array of arrays, a table by JSON_TABLE (see ``in_list``).
        columns_sql = ", ".join(
            f"{name} {_JSON_TABLE_TYPES.get(name, kind.compile(dialect=mysql.dialect()))} "
            f"PATH '$[{i}]'"
            for i, (name, kind) in enumerate(CHANGE_COLUMNS)
        )
        table = sa.text(f"SELECT * FROM JSON_TABLE(:changes, '$[*]' COLUMNS ({columns_sql})) AS c")
        typed = table.bindparams(sa.bindparam("changes", type_=sa.JSON())).columns(
            *(sa.column(name, kind) for name, kind in CHANGE_COLUMNS)
        )
        return typed.subquery("change")

    def planner_estimate(self, conn: sa.Connection, rows: sa.Select[Any]) -> int | None:
        # From dives into the index whose range it reads.
        sql = rows.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        plan_row = conn.exec_driver_sql(f"EXPLAIN {sql}").mappings().one()
        return int(plan_row["rows"] or 0)

    def hold_stage_session(self, conn: sa.Connection) -> None:
        # The server closes a connection idle for wait_timeout (8 hours by default, often
        # less), and its named lock goes with it: a write outliving that would see its stage
        # dropped under it.
        conn.execute(sa.text(f"SET SESSION wait_timeout = {SPARK_STAGE_LOCK_WAIT_TIMEOUT_S}"))

    def try_stage_lock(self, conn: sa.Connection, name: str, key: tuple[int, int]) -> bool:
        # Named locks are the server's, not a database's; the name's 48 random bits keep
        # stages of two databases apart.
        return bool(conn.execute(sa.select(sa.func.get_lock(name, 0))).scalar())

    def unlock_stage(self, conn: sa.Connection, name: str, key: tuple[int, int]) -> None:
        conn.execute(sa.select(sa.func.release_lock(name)))

    def lock_migrations(self, conn: sa.Connection) -> None:
        # A named lock, the session's (its DDL commits at once: no transaction holds a
        # migration), released when the migration's connection closes. Names are the
        # server's and at most 64 characters: this database's, hashed.
        name = sa.func.concat("outbox-relay-migrate-", sa.func.md5(sa.func.database()))
        if conn.execute(sa.select(sa.func.get_lock(name, MIGRATION_LOCK_WAIT_S))).scalar() != 1:
            raise StoreError(
                f"another `relay migrate` held this database for {MIGRATION_LOCK_WAIT_S} s"
            )

    def grant(self, privileges: str, table: str, grantee: str, database: str) -> str:
        return f"GRANT {privileges} ON `{database}`.`{table}` TO {grantee}"


def no_pad_collation(dialect: sa.Dialect) -> str:
    """The server's byte-by-byte collation that tells trailing spaces apart (NO PAD).
    ``utf8mb4_bin`` is PAD SPACE: ``'k-1'`` and ``'k-1 '`` are one value to it, so two message
    ids (or inbox keys, or exchanges) differing by trailing spaces collided in a unique index,
    and a lookup of one found the other (migration 0010)."""
    return "utf8mb4_nopad_bin" if getattr(dialect, "is_mariadb", False) else "utf8mb4_0900_bin"


def _options(url: sa.URL, relay_session: bool) -> tuple[sa.URL, dict[str, Any], dict[str, Any]]:
    """The URL (dialect ``mysql`` whichever the URL says, utf8mb4), the driver's connect
    arguments, the engine's options."""
    url = url.set(drivername=f"mysql+{url.get_driver_name() or 'mysqldb'}")
    url = url.update_query_dict({"charset": "utf8mb4"})
    # No CLIENT_FOUND_ROWS (SQLAlchemy sets it for its ORM): a statement's row count is then the
    # rows it changed, so an insert that skips message ids already there counts what it added.
    connect_args: dict[str, Any] = {"connect_timeout": DB_CONNECT_TIMEOUT_S, "client_flag": 0}
    options: dict[str, Any] = {"isolation_level": "READ COMMITTED"} if relay_session else {}
    return url, connect_args, options


def _session(relay_session: bool, inbox_session: bool, dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("SELECT VERSION()")
    server = str(cursor.fetchone()[0])
    problem = server_version_problem(server)
    if problem is not None:
        raise ConfigError(problem)
    cursor.execute(MYSQL_SESSION)
    mariadb = _is_mariadb(server)
    if relay_session:
        cursor.execute(MARIADB_RELAY_SESSION if mariadb else MYSQL_RELAY_SESSION)
    elif inbox_session:
        cursor.execute(MARIADB_INBOX_SESSION if mariadb else MYSQL_INBOX_SESSION)
    if relay_session or inbox_session:
        fileno = getattr(dbapi_connection, "fileno", None)
        if fileno is not None:  # aiomysql's adapter has none: its keepalive is the server's
            keep_alive(fileno())
    cursor.close()


def _is_mariadb(server: str) -> bool:
    return "mariadb" in server.lower()


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
    mariadb = _is_mariadb(server)
    floor = MARIADB_MIN_VERSION if mariadb else MYSQL_MIN_VERSION
    if version < floor:
        name = "MariaDB" if mariadb else "MySQL"
        shown = ".".join(map(str, version))
        return (
            f"{name} {shown} cannot hold the outbox: it needs {name} "
            f"{'.'.join(map(str, floor))} or later (FOR UPDATE SKIP LOCKED, JSON_TABLE)"
        )
    return None


DIALECT = MySQL()
