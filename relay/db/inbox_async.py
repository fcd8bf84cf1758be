"""The inbox's database side for asyncio consumers (``relay.inbox.aio``): the blocking store's
statements (``InboxStatements``) run through SQLAlchemy's asyncio engine, and the handler's
transaction as awaitable calls. Nothing here blocks the event loop: the drivers are
psycopg's asyncio connection, aiomysql and aiosqlite."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from relay.db.engine import create_async_engine, db_errors
from relay.db.inbox import (
    InboxStatements,
    Outcome,
    Ran,
    TransactionEnded,
    guarded,
    still_open,
)
from relay.redact import redact_url

T = TypeVar("T")


class AsyncTransaction:
    """``relay.db.inbox.Transaction`` for asyncio handlers: write and read in the transaction
    that holds the message's key (``await tx.execute(...)``), never end it."""

    __slots__ = ("_conn",)

    def __init__(self, conn: AsyncConnection) -> None:
        self._conn = conn

    @property
    def dialect(self) -> sa.Dialect:
        return self._conn.dialect

    async def execute(
        self, statement: Any, parameters: Any = None, **options: Any
    ) -> sa.CursorResult[Any]:
        result: sa.CursorResult[Any] = await self._conn.execute(
            guarded(statement), parameters, execution_options=options
        )
        return result

    async def scalar(self, statement: Any, parameters: Any = None) -> Any:
        return (await self.execute(statement, parameters)).scalar()

    async def scalars(self, statement: Any, parameters: Any = None) -> sa.ScalarResult[Any]:
        return (await self.execute(statement, parameters)).scalars()

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[AsyncTransaction]:
        """A part of the handler's work that an exception inside rolls back alone."""
        async with self._conn.begin_nested():
            yield self


class AsyncInboxStore:
    """``relay.db.inbox.InboxStore`` on an asyncio engine: each statement in a transaction of
    its own (``call``), a handler's run in the transaction that holds its key (``run``)."""

    def __init__(self, url: str, consumer: str) -> None:
        self.engine = create_async_engine(url)
        self.consumer = consumer
        self.where = redact_url(url)
        self.statements = InboxStatements(self.engine.dialect, consumer)

    async def call(self, what: str, statement: Callable[..., T], *args: Any) -> T:
        """One of ``self.statements`` in a transaction of its own; StoreError when it fails."""
        with db_errors(what, self.where):
            async with self.engine.begin() as conn:
                return await conn.run_sync(statement, *args)

    async def run(
        self, message_id: str, handler: Callable[[AsyncTransaction], Awaitable[object]]
    ) -> Ran:
        """``handler`` in the transaction whose first statement inserts the message's key,
        unless the key was there; StoreError when the inbox's own statements fail."""
        with db_errors("the inbox's transaction", self.where):
            async with self.engine.connect() as conn:
                tx = await conn.begin()
                if not await self._add_key(conn, message_id):
                    await tx.rollback()
                    return Ran(Outcome.DUPLICATE)
                started = time.perf_counter()
                try:
                    await handler(AsyncTransaction(conn))
                except Exception as exc:
                    await tx.rollback()
                    return Ran(Outcome.FAILED, error=exc)
                if conn.sync_connection is None or not still_open(conn.sync_connection):
                    await tx.rollback()
                    ended = "the handler's transaction was ended before its commit"
                    return Ran(Outcome.ENDED, error=TransactionEnded(ended))
                await tx.commit()
        return Ran(Outcome.DONE, time.perf_counter() - started)

    async def _add_key(self, conn: AsyncConnection, message_id: str) -> bool:
        """``InboxStatements.add_key``; on psycopg's asyncio connection awaited on the driver
        itself (as the blocking store does: a statement through SQLAlchemy, and its hop into
        ``run_sync``, cost more than a tenth of a delivery)."""
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        if not isinstance(driver, psycopg.AsyncConnection):
            return await conn.run_sync(self.statements.add_key, message_id)
        key = self.statements.key_row(message_id)
        sql = self.statements.key_sql
        try:
            cursor = await driver.execute(sql, key)
            return await cursor.fetchone() is not None
        except psycopg.Error as exc:
            raise sa.exc.DBAPIError.instance(sql, key, exc, psycopg.Error) from exc

    async def close(self) -> None:
        await self.engine.dispose()
