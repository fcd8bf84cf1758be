"""Handlers written as scripts, the same for the blocking and the asyncio inboxes: what a
handler does in the inbox's transaction (write an effect, run SQL text, end the transaction
through the driver, swallow a database error, raise), for the store's contract and the
inbox's model, which run one script through every kind of inbox and compare."""

from __future__ import annotations

import contextlib
import inspect
import sqlite3
import threading
from asyncio import CancelledError, Task, get_running_loop
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession
from sqlalchemy.orm import Session
from sqlalchemy.orm.session import JoinTransactionMode

from relay.db.inbox_async import AsyncTransaction
from relay.db.inbox_transaction import Transaction, TransactionEnded

# A message's payload and a statement's parameter that no record of a failure may show.
SECRET = "4111111111111111"

effects = sa.Table(
    "effects",
    sa.MetaData(),
    sa.Column("note", sa.String(64), nullable=False),
    sa.Column("secret", sa.String(64), unique=True),
)

# An action: (what, its argument). What:
#   write     an effect row noted with the argument
#   sql       the argument as SQL text, through ``tx.execute`` (the guard may refuse it)
#   driver    the driver connection's method of that name (commit, rollback), past ``tx``
#   cursor    the argument as SQL text through a cursor of the driver's connection, past ``tx``
#   part      an effect row noted with the argument in ``tx.savepoint()``, kept
#   undone    the same, the savepoint's block raising (caught outside it): that part undone
#   door      a door of ``DOORS`` (by name), the ``TransactionEnded`` it may raise swallowed, as
#             a handler that catches every error would
#   swallow   a statement that fails (no such table), its error caught: on PostgreSQL the
#             transaction is aborted under the handler
#   fails     the argument as SQL text through ``tx.execute``, the database's error it fails
#             with caught (SQLite's ``INSERT OR ROLLBACK`` rolls back the whole transaction)
#   duplicate a row whose unique value (``SECRET``) is there already: the database's error,
#             its message and parameters quoting the value, raised out of the handler
#   untraced  SQLite's trace callback replaced through the driver (a statement log of the
#             handler's own), the inbox's watch of the connection's statements with it
#   listen    a SQLAlchemy event listener left on what the argument names (``connection:commit``,
#             ``engine:rollback``: reached through a result), which writes an effect noted
#             ``listener`` through the driver and commits it, at the inbox's own commit or
#             rollback
#   autocommit  autocommit turned on through the driver (PostgreSQL's after a commit: it
#             takes none with a transaction open), as a handler past ``tx`` could
#   touch     the file the argument names made (a proxy watching it cuts its connections)
#   call      the function registered in ``CALLS`` under the argument (a test's own hold)
#   later     the argument as SQL text through ``tx`` from a thread (blocking) or a task
#             (asyncio) the handler leaves running, after ``CALLS["later"]`` if a test
#             registered it (a thread's hold); what it met goes in ``LATE``
#   keep      ``tx`` kept in ``KEPT``, for a test to use once the run is over
#   cut       the ``INTERRUPTIONS`` of the argument's name raised: the handler cut off by
#             what is not an error (Ctrl-C, ``sys.exit``, its task cancelled)
#   raise     a ValueError whose message quotes ``SECRET``
Action = tuple[str, str]
Script = Sequence[Action]


# The ways past ``tx``'s own ``execute`` to SQLAlchemy's connection (a handler reaches it
# through a result: ``tx.execute(...).context.root_connection``; an asyncio handler through
# ``tx``'s connection, as awaitable calls): name -> (what is called on the connection, and
# with what; a session's, or a statement's).
DOORS: dict[str, tuple[str, str]] = {
    "DDL": ("execute", "ddl"),
    "DDL.execute_if": ("execute", "ddl_if"),
    "a literal column": ("execute", "literal"),
    "text in a CTE": ("execute", "cte"),
    "exec_driver_sql": ("exec_driver_sql", "COMMIT"),
    "the connection's commit": ("commit", ""),
    "the connection's rollback": ("rollback", ""),
    "the connection's begin_nested": ("begin_nested", ""),
    "the connection's close": ("close", ""),
    "the connection's isolation level": ("execution_options", "AUTOCOMMIT"),
    "a session's commit": ("session", "commit"),
    "a session's rollback": ("session", "rollback"),
    "a session's begin_nested": ("session", "begin_nested"),
}


def _statement(name: str, dialect: str) -> Any:
    """A statement that carries ``COMMIT`` in a construct of ``name``."""
    if name in ("ddl", "ddl_if"):
        ddl = sa.DDL("COMMIT")  # type: ignore[no-untyped-call]  # SQLAlchemy's DDL is untyped
        return ddl if name == "ddl" else ddl.execute_if(dialect=dialect)
    if name == "literal":
        return sa.select(sa.literal_column("1; COMMIT"))
    rows = sa.select(sa.literal_column("1").label("x")).cte("c")
    return sa.select(rows.c.x).where(sa.text("1 = 1; COMMIT"))


def through(conn: sa.Connection, door: str) -> None:
    method, argument = DOORS[door]
    if method == "execute":
        conn.execute(_statement(argument, conn.dialect.name))
    elif method == "exec_driver_sql":
        conn.exec_driver_sql(argument)
    elif method == "execution_options":
        conn.execution_options(isolation_level=argument)
    elif method == "session":
        mode: JoinTransactionMode = (
            "create_savepoint" if argument == "begin_nested" else "control_fully"
        )
        session = Session(bind=conn, join_transaction_mode=mode)
        session.execute(sa.select(1))  # the session joins the connection's transaction
        getattr(session, argument)()
    else:
        getattr(conn, method)()


async def through_async(conn: AsyncConnection, door: str) -> None:
    method, argument = DOORS[door]
    if method == "execute":
        await conn.execute(_statement(argument, conn.dialect.name))
    elif method == "exec_driver_sql":
        await conn.exec_driver_sql(argument)
    elif method == "execution_options":
        await conn.execution_options(isolation_level=argument)
    elif method == "session":
        mode: JoinTransactionMode = (
            "create_savepoint" if argument == "begin_nested" else "control_fully"
        )
        session = AsyncSession(bind=conn, join_transaction_mode=mode)
        await session.execute(sa.select(1))
        if argument == "begin_nested":
            await session.begin_nested().start()
        else:
            await getattr(session, argument)()
    elif method == "begin_nested":
        await conn.begin_nested().start()
    else:
        await getattr(conn, method)()


# What a script's ``cut`` raises, by name.
INTERRUPTIONS: dict[str, type[BaseException]] = {
    "KeyboardInterrupt": KeyboardInterrupt,
    "SystemExit": SystemExit,
    "CancelledError": CancelledError,
}

# Functions a script's ``call`` runs, by name: a test registers them.
CALLS: dict[str, Callable[[], None]] = {}
# What each ``later`` statement met: None (sent), or its exception; the tasks that send them.
LATE: list[Exception | None] = []
LATE_TASKS: set[Task[None]] = set()
# Each ``keep``'s ``tx``.
KEPT: list[Any] = []


def _later(tx: Transaction, sql: str) -> None:
    def send() -> None:
        CALLS.get("later", lambda: None)()
        try:
            tx.execute(sql)
            LATE.append(None)
        except Exception as exc:
            LATE.append(exc)

    threading.Thread(target=send, daemon=True).start()


def _later_async(tx: AsyncTransaction, sql: str) -> None:
    async def send() -> None:
        try:
            await tx.execute(sql)
            LATE.append(None)
        except Exception as exc:
            LATE.append(exc)

    task = get_running_loop().create_task(send())
    LATE_TASKS.add(task)
    task.add_done_callback(LATE_TASKS.discard)


class Failed(ValueError):
    """What a script's ``raise`` raises."""


def blocking(script: Script) -> Callable[[Transaction], None]:
    def handle(tx: Transaction) -> None:
        for what, argument in script:
            if what == "write":
                tx.execute(effects.insert(), {"note": argument})
            elif what == "sql":
                tx.execute(argument)
            elif what == "driver":
                getattr(_driver(tx), argument)()
            elif what in ("part", "undone"):
                with contextlib.suppress(Failed), tx.savepoint():
                    tx.execute(effects.insert(), {"note": argument})
                    if what == "undone":
                        raise Failed("undone")
            elif what == "cursor":
                _driver(tx).cursor().execute(argument)
            elif what == "door":
                with contextlib.suppress(TransactionEnded):
                    through(tx.execute(sa.select(1)).context.root_connection, argument)
            elif what == "swallow":
                with contextlib.suppress(sa.exc.DBAPIError):
                    tx.execute(sa.text("SELECT * FROM no_such_table"))
            elif what == "fails":
                with contextlib.suppress(sa.exc.DBAPIError):
                    tx.execute(argument)
            elif what == "duplicate":
                tx.execute(effects.insert(), [{"note": argument, "secret": SECRET}] * 2)
            elif what == "autocommit":
                _autocommit(_driver(tx))
            elif what == "untraced":
                _driver(tx).set_trace_callback(_own_log)
            elif what == "listen":
                _listen(tx.execute(sa.select(1)).context.root_connection, argument)
            elif what == "touch":
                Path(argument).touch()
            elif what == "call":
                CALLS[argument]()
            elif what == "later":
                _later(tx, argument)
            elif what == "keep":
                KEPT.append(tx)
            elif what == "cut":
                raise INTERRUPTIONS[argument]
            else:
                raise Failed(f"cannot charge card {SECRET}")

    return handle


def _listen(conn: sa.Connection, where: str) -> None:
    """``listen``'s listener, on ``conn`` or its engine."""
    target, event = where.split(":")

    def write(listened: sa.Connection) -> None:
        driver = listened.connection.dbapi_connection  # the asyncio driver's adapted too
        assert driver is not None
        driver.cursor().execute("INSERT INTO effects (note) VALUES ('listener')")
        driver.commit()

    sa.event.listen(conn if target == "connection" else conn.engine, event, write)


def _own_log(_statement: str) -> None:
    """A handler's own trace of its statements (``untraced``), which logs nothing here."""


def _autocommit(driver: Any) -> None:
    if isinstance(driver, sqlite3.Connection):
        driver.isolation_level = None
    elif isinstance(driver, psycopg.Connection):
        driver.commit()
        driver.autocommit = True
    else:  # mysqlclient's
        driver.autocommit(True)


async def _autocommit_async(driver: Any) -> None:
    if isinstance(driver, psycopg.AsyncConnection):
        await driver.commit()
        await driver.set_autocommit(True)
    elif hasattr(driver, "isolation_level"):  # aiosqlite's
        driver.isolation_level = None
    else:  # aiomysql's
        await driver.autocommit(True)


def asyncio(script: Script) -> Callable[[AsyncTransaction], Awaitable[None]]:
    async def handle(tx: AsyncTransaction) -> None:
        for what, argument in script:
            if what == "write":
                await tx.execute(effects.insert(), {"note": argument})
            elif what == "sql":
                await tx.execute(argument)
            elif what == "driver":
                raw = await tx._conn.get_raw_connection()
                await getattr(raw.driver_connection, argument)()
            elif what in ("part", "undone"):
                with contextlib.suppress(Failed):
                    async with tx.savepoint():
                        await tx.execute(effects.insert(), {"note": argument})
                        if what == "undone":
                            raise Failed("undone")
            elif what == "cursor":
                raw = await tx._conn.get_raw_connection()
                assert raw.driver_connection is not None
                cursor = await _awaited(raw.driver_connection.cursor())
                await cursor.execute(argument)
            elif what == "door":
                with contextlib.suppress(TransactionEnded):
                    await through_async(tx._conn, argument)
            elif what == "swallow":
                with contextlib.suppress(sa.exc.DBAPIError):
                    await tx.execute(sa.text("SELECT * FROM no_such_table"))
            elif what == "fails":
                with contextlib.suppress(sa.exc.DBAPIError):
                    await tx.execute(argument)
            elif what == "duplicate":
                await tx.execute(effects.insert(), [{"note": argument, "secret": SECRET}] * 2)
            elif what == "autocommit":
                raw = await tx._conn.get_raw_connection()
                await _autocommit_async(raw.driver_connection)
            elif what == "listen":
                _listen((await tx.execute(sa.select(1))).context.root_connection, argument)
            elif what == "untraced":
                raw = await tx._conn.get_raw_connection()
                assert raw.driver_connection is not None
                await raw.driver_connection.set_trace_callback(_own_log)
            elif what == "touch":
                Path(argument).touch()
            elif what == "call":
                CALLS[argument]()  # blocks this consumer's loop alone: its own thread's
            elif what == "later":
                _later_async(tx, argument)
            elif what == "keep":
                KEPT.append(tx)
            elif what == "cut":
                raise INTERRUPTIONS[argument]
            else:
                raise Failed(f"cannot charge card {SECRET}")

    return handle


async def _awaited(value: Any) -> Any:
    """A cursor: aiosqlite's and aiomysql's are awaited, psycopg's is not."""
    return await value if inspect.isawaitable(value) else value


def _driver(tx: Transaction) -> Any:
    return tx._conn.connection.driver_connection
