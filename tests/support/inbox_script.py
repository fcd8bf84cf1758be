"""Handlers written as scripts, the same for the blocking and the asyncio inboxes: what a
handler does in the inbox's transaction (write an effect, run SQL text, end the transaction
through the driver, swallow a database error, raise), for the store's contract and the
inbox's model, which run one script through every kind of inbox and compare."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

from relay.db.inbox_async import AsyncTransaction
from relay.db.inbox_transaction import Transaction

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
#   swallow   a statement that fails (no such table), its error caught: on PostgreSQL the
#             transaction is aborted under the handler
#   duplicate a row whose unique value (``SECRET``) is there already: the database's error,
#             its message and parameters quoting the value, raised out of the handler
#   autocommit  autocommit turned on through the driver (PostgreSQL's after a commit: it
#             takes none with a transaction open), as a handler past ``tx`` could
#   touch     the file the argument names made (a proxy watching it cuts its connections)
#   call      the function registered in ``CALLS`` under the argument (a test's own hold)
#   raise     a ValueError whose message quotes ``SECRET``
Action = tuple[str, str]
Script = Sequence[Action]


# Functions a script's ``call`` runs, by name: a test registers them.
CALLS: dict[str, Callable[[], None]] = {}


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
            elif what == "swallow":
                with contextlib.suppress(sa.exc.DBAPIError):
                    tx.execute(sa.text("SELECT * FROM no_such_table"))
            elif what == "duplicate":
                tx.execute(effects.insert(), [{"note": argument, "secret": SECRET}] * 2)
            elif what == "autocommit":
                _autocommit(_driver(tx))
            elif what == "touch":
                Path(argument).touch()
            elif what == "call":
                CALLS[argument]()
            else:
                raise Failed(f"cannot charge card {SECRET}")

    return handle


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
            elif what == "swallow":
                with contextlib.suppress(sa.exc.DBAPIError):
                    await tx.execute(sa.text("SELECT * FROM no_such_table"))
            elif what == "duplicate":
                await tx.execute(effects.insert(), [{"note": argument, "secret": SECRET}] * 2)
            elif what == "autocommit":
                raw = await tx._conn.get_raw_connection()
                await _autocommit_async(raw.driver_connection)
            elif what == "touch":
                Path(argument).touch()
            elif what == "call":
                CALLS[argument]()  # blocks this consumer's loop alone: its own thread's
            else:
                raise Failed(f"cannot charge card {SECRET}")

    return handle


def _driver(tx: Transaction) -> Any:
    return tx._conn.connection.driver_connection
