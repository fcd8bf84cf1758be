"""PostgreSQL (psycopg 3): the production database.

Sessions: the relay's own are bounded and commit without waiting for the flush (see
``relay.db.engine``); everyone else's commit durably whatever the server's default. Row ids
travel as one binary ``bigint[]``, row changes as arrays unnested into a table, acks as one
data-modifying statement; the Spark writer COPYs its rows in.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import psycopg
import psycopg.adapt
import psycopg.postgres
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from relay.constants import (
    DB_CONNECT_TIMEOUT_S,
    DB_IDLE_IN_TRANSACTION_S,
    DB_KEEPALIVE_COUNT,
    DB_KEEPALIVE_IDLE_S,
    DB_KEEPALIVE_INTERVAL_S,
    DB_LOCK_TIMEOUT_MS,
    DB_STATEMENT_TIMEOUT_MS,
    DB_TCP_USER_TIMEOUT_S,
    MERGE_WORK_MEM,
    MIGRATION_DDL_LOCK_TIMEOUT_MS,
    MIGRATION_LOCK_KEY,
    SENT_LOG_REBUILD_CLIENT_CHECK_MS,
    SENT_LOG_REBUILD_WORK_MEM,
)
from relay.db.dialects.base import BINARY_RESULTS, CHANGE_COLUMNS, Dialect
from relay.db.dialects.postgresql_inbox import PostgreSQLInbox

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

# The relay's own session settings (``relay_session=True``), each for a reason:
RELAY_SESSION_SETTINGS = {
    # Bounded: see ``relay.db.engine`` and the constants.
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
    # See ``relay.db.engine``.
    "synchronous_commit": "off",
}
APPLICATION_NAME = "outbox-relay"
# An inbox's sessions (``inbox_session=True``): lock waits and statements bounded as the
# relay's, no idle limit (see ``relay.db.engine``).
INBOX_SESSION_SETTINGS = {
    "statement_timeout": str(DB_STATEMENT_TIMEOUT_MS),
    "lock_timeout": str(DB_LOCK_TIMEOUT_MS),
}
# libpq's keepalives and its timeout for unacknowledged data (see ``relay.db.engine``).
PG_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": DB_KEEPALIVE_IDLE_S,
    "keepalives_interval": DB_KEEPALIVE_INTERVAL_S,
    "keepalives_count": DB_KEEPALIVE_COUNT,
    "tcp_user_timeout": DB_TCP_USER_TIMEOUT_S * 1000,
}
# The driver SQLAlchemy is told to use.
DRIVER = "postgresql+psycopg"


class PostgreSQL(PostgreSQLInbox, Dialect):
    name: ClassVar[str] = "postgresql"
    url_backends: ClassVar[tuple[str, ...]] = ("postgresql", "postgres")
    epoch: ClassVar[str] = "'epoch'::timestamptz"
    aware_times: ClassVar[bool] = True
    # The byte-wise comparisons of text_pattern_ops (the console's message index, migration
    # 0016): in a database's language collation ``ab-c`` sorts among ``abc…``, so ``>=`` and
    # ``<`` there make no prefix's range (and a bound LIKE pattern no index range in a
    # generic plan).
    prefix_operators: ClassVar[tuple[str, str]] = ("~>=~", "~<~")
    # Its key index's page images made an ack cost nine times the INSERT's WAL once the log
    # was a few days old (``relay.db.schema.outbox_sent_journal``).
    journals_sent_log: ClassVar[bool] = True
    copies_rows: ClassVar[bool] = True
    stage_locks: ClassVar[bool] = True

    lock_timeout_error = psycopg.errors.LockNotAvailable

    def engine(
        self, url: sa.URL, *, relay_session: bool, inbox_session: bool, pre_ping: bool
    ) -> sa.Engine:
        connect_args = _connect_args(relay_session, inbox_session)
        engine = sa.create_engine(
            url.set(drivername=DRIVER), pool_pre_ping=pre_ping, connect_args=connect_args
        )
        sa.event.listen(engine, "before_cursor_execute", _binary_results)
        sa.event.listen(engine, "connect", _register_dumpers)
        return engine

    def short_reads(self, engine: sa.Engine) -> None:
        # The console's statements read an index for a page, or count up to a cap, but the
        # planner costs a correlated count for every row it could reach: at a million parked
        # rows its estimate passed jit_above_cost, and compiling took 1.2 s of a 30 ms query.
        sa.event.listen(engine, "connect", _no_jit)

    def async_engine(self, url: sa.URL) -> AsyncEngine:
        from sqlalchemy.ext.asyncio import create_async_engine

        connect_args = _connect_args(relay_session=False, inbox_session=True)
        return create_async_engine(url.set(drivername=DRIVER), connect_args=connect_args)

    def new_message_id(self) -> str:
        return "gen_random_uuid()::text"

    def sent_key(self, message_id: str) -> str:
        # Its MD5 as a 16-byte uuid (``relay.db.columns.sent_key`` says why).
        return f"md5({message_id})::uuid"

    def sent_key_value(self, message_id: str) -> str | bytes:
        return str(uuid.UUID(hashlib.md5(message_id.encode()).hexdigest()))

    def database_time(self, seconds: str) -> str:
        return f"(statement_timestamp() + make_interval(secs => {seconds}))"

    def seconds_between(self, start: str, end: str) -> str:
        return f"extract(epoch FROM {end} - {start})::float8"

    def insert(self, table: sa.Table) -> Any:
        return postgresql.insert(table)

    def in_list(
        self, column: sa.ColumnElement[Any], name: str, kind: sa.types.TypeEngine[Any]
    ) -> sa.ColumnElement[bool]:
        # Any whole numbers as one binary bigint[] (``_Int8sDumper``): a claim's 32 buckets
        # as a smallint[] took psycopg's list dumper a regular expression each.
        integers = isinstance(kind, sa.Integer)
        array = _BigIntArray() if integers else postgresql.ARRAY(kind)
        return column == sa.any_(sa.bindparam(name, type_=array))

    def in_once(
        self, value: sa.ColumnElement[Any], choices: sa.Select[Any]
    ) -> sa.ColumnElement[bool]:
        # ``IN (subquery)`` is a join the planner may turn around; with statistics taken while
        # a table was empty and rows loaded since, it chose a nested loop that ran the
        # subquery for every row (tests/integration/test_claim_plan.py). ``= ANY(ARRAY(...))``
        # is an InitPlan, run once, whatever the statistics say.
        return value == sa.any_(sa.func.array(choices.scalar_subquery()))

    def changes_table(self) -> sa.Subquery | sa.TableValuedAlias:
        arrays = [
            sa.bindparam(f"change_{name}", type_=postgresql.ARRAY(kind))
            for name, kind in CHANGE_COLUMNS
        ]
        columns = [sa.column(name, kind) for name, kind in CHANGE_COLUMNS]
        return sa.func.unnest(*arrays).table_valued(*columns).render_derived("change")

    def changes_parameters(self, changes: Sequence[Sequence[Any]]) -> dict[str, list[Any]]:
        return {
            f"change_{name}": [change[i] for change in changes]
            for i, (name, _kind) in enumerate(CHANGE_COLUMNS)
        }

    def planner_estimate(self, conn: sa.Connection, rows: sa.Select[Any]) -> int | None:
        sql = rows.compile(dialect=conn.dialect, compile_kwargs={"literal_binds": True})
        (plan,) = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {sql}").scalar_one()
        return int(plan["Plan"]["Plan Rows"])

    def error_facts(self, error: BaseException) -> list[str] | None:
        if not isinstance(error, psycopg.Error):
            return None
        facts = [f"SQLSTATE {error.sqlstate}"] if error.sqlstate else []
        diag = error.diag
        for name, value in (
            ("constraint", diag.constraint_name),
            ("table", diag.table_name),
            ("column", diag.column_name),
        ):
            if value:
                facts.append(f"{name} {value}")
        return facts

    def prepare_merge(self, conn: sa.Connection) -> None:
        conn.execute(sa.text(f"SET LOCAL work_mem = '{MERGE_WORK_MEM}'"))

    def try_stage_lock(self, conn: sa.Connection, name: str, key: tuple[int, int]) -> bool:
        return bool(conn.execute(sa.select(sa.func.pg_try_advisory_lock(*key))).scalar())

    def unlock_stage(self, conn: sa.Connection, name: str, key: tuple[int, int]) -> None:
        conn.execute(sa.select(sa.func.pg_advisory_unlock(*key)))

    def lock_migrations(self, conn: sa.Connection) -> None:
        # Held until the migration's transaction ends (its DDL is transactional too).
        conn.execute(sa.select(sa.func.pg_advisory_xact_lock(MIGRATION_LOCK_KEY)))

    def bound_ddl_locks(self, conn: sa.Connection) -> None:
        # After the migrations' lock, whose wait it must not bound.
        conn.execute(sa.text(f"SET LOCAL lock_timeout = {MIGRATION_DDL_LOCK_TIMEOUT_MS}"))

    def unbounded(self, conn: sa.Connection) -> None:
        # Settings a role may change for itself: the caller's rights suffice. Its lock waits
        # are not bounded either: an operator's lock would otherwise fail it every few
        # seconds. A stop cancels it (``cancel``), and the client check ends it if its relay
        # dies.
        conn.execute(sa.text("SET LOCAL statement_timeout = 0"))
        conn.execute(sa.text("SET LOCAL lock_timeout = 0"))
        conn.execute(sa.text(f"SET LOCAL work_mem = '{SENT_LOG_REBUILD_WORK_MEM}'"))
        check = SENT_LOG_REBUILD_CLIENT_CHECK_MS
        conn.execute(sa.text(f"SET LOCAL client_connection_check_interval = {check}"))

    def cancel(self, driver_connection: Any) -> None:
        driver_connection.cancel_safe(timeout=DB_CONNECT_TIMEOUT_S)

    def insert_or_replace(self, table: sa.Table, key: sa.Column[Any]) -> sa.Insert:
        insert = postgresql.insert(table)
        others = {c.name: insert.excluded[c.name] for c in table.columns if c is not key}
        return insert.on_conflict_do_update(index_elements=[key], set_=others)

    def durable_commit(self, conn: sa.Connection) -> None:
        # An asynchronous commit is visible before it is flushed; a synchronous one only
        # after, so that no one acts on what a crash then undoes.
        conn.execute(sa.text("SET LOCAL synchronous_commit = on"))

    def sequence_grants(self, grantee: str, tables: tuple[str, ...]) -> list[str]:
        # An INSERT that takes its id from a table's sequence needs to use it.
        return [f"GRANT USAGE ON SEQUENCE {table}_id_seq TO {grantee}" for table in tables]


def _connect_args(relay_session: bool, inbox_session: bool) -> dict[str, Any]:
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


def _no_jit(dbapi_connection: Any, _record: Any) -> None:
    with dbapi_connection.cursor() as cursor:
        cursor.execute("SET jit = off")
    dbapi_connection.commit()


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


class _Int8s(tuple[int, ...]):
    """Ids bound as one ``bigint[]`` (``in_list``), by ``_Int8sDumper``."""


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
    connection of this dialect's engines)."""

    cache_ok = True

    def get_col_spec(self, **_kw: Any) -> str:
        return "BIGINT[]"

    def bind_processor(
        self, dialect: sa.Dialect
    ) -> Callable[[Sequence[int] | None], _Int8s | None]:
        return lambda ids: None if ids is None else _Int8s(ids)


def _register_dumpers(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.adapters.register_dumper(_Int8s, _Int8sDumper)


DIALECT = PostgreSQL()
