"""Handlers written as scripts, the same for the blocking and the asyncio inboxes: what a
handler does in the inbox's transaction (write an effect, run SQL text, end the transaction
through the driver, swallow a database error, raise), for the store's contract and the
inbox's model, which run one script through every kind of inbox and compare."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import sqlalchemy as sa

from relay.db.inbox import Transaction
from relay.db.inbox_async import AsyncTransaction

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
#   raise     a ValueError whose message quotes ``SECRET``
Action = tuple[str, str]
Script = Sequence[Action]


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
            else:
                raise Failed(f"cannot charge card {SECRET}")

    return handle


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
            else:
                raise Failed(f"cannot charge card {SECRET}")

    return handle


def _driver(tx: Transaction) -> Any:
    return tx._conn.connection.driver_connection
