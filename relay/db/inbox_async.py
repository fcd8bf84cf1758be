"""The inbox's database side for asyncio consumers (``relay.inbox.aio``): the blocking store's
statements (``InboxStatements``) run through SQLAlchemy's asyncio engine, and the handler's
transaction as awaitable calls. Nothing here blocks the event loop: the drivers are
psycopg's asyncio connection, aiomysql and aiosqlite."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from relay.db.engine import create_async_engine, db_errors
from relay.db.inbox import (
    LOOKING,
    ROLLED_BACK,
    TransactionFailed,
    classified,
    handler_failed,
    holds_inbox,
    kept_by_rollback,
    own,
    run_lock,
    spoilt,
    went_on_here,
)
from relay.db.inbox_listeners import kept_off
from relay.db.inbox_statements import COMMIT, InboxStatements, last_status
from relay.db.inbox_transaction import Guard, Guards, executable
from relay.errors import StoreError
from relay.redact import redact_url

T = TypeVar("T")


class AsyncTransaction:
    """``relay.db.inbox_transaction.Transaction`` for asyncio handlers: write and read in the
    transaction that holds the message's key (``await tx.execute(...)``), never end it."""

    __slots__ = ("_conn", "_guard")

    def __init__(self, conn: AsyncConnection, guard: Guard) -> None:
        self._conn = conn
        self._guard = guard

    @property
    def dialect(self) -> sa.Dialect:
        return self._conn.dialect

    async def execute(
        self, statement: Any, parameters: Any = None, **options: Any
    ) -> sa.CursorResult[Any]:
        self._guard.still_running()
        result: sa.CursorResult[Any] = await self._conn.execute(
            executable(statement), parameters, execution_options=options
        )
        return result

    async def scalar(self, statement: Any, parameters: Any = None) -> Any:
        return (await self.execute(statement, parameters)).scalar()

    async def scalars(self, statement: Any, parameters: Any = None) -> sa.ScalarResult[Any]:
        return (await self.execute(statement, parameters)).scalars()

    @asynccontextmanager
    async def savepoint(self) -> AsyncIterator[AsyncTransaction]:
        """A part of the handler's work that an exception inside rolls back alone."""
        self._guard.still_running()
        nested = self._conn.begin_nested()
        with self._guard.own():
            await nested.start()
        try:
            yield self
        except BaseException:
            with self._guard.own():
                await nested.rollback()
            raise
        with self._guard.own():
            await nested.commit()


class AsyncInboxStore:
    """``relay.db.inbox.InboxStore`` on an asyncio engine: each statement in a transaction of
    its own (``call``), a delivery's steps through ``message``."""

    def __init__(self, url: str, consumer: str) -> None:
        self.engine = create_async_engine(url)
        self.consumer = consumer
        self.where = redact_url(url)
        self.statements = InboxStatements(self.engine.dialect, consumer)
        self.guards = Guards(self.engine.sync_engine)
        self._run_lock = run_lock(self.engine.url)

    async def call(self, what: str, statement: Callable[..., T], *args: Any) -> T:
        """One of ``self.statements`` in a transaction of its own; StoreError when it fails."""
        with db_errors(what, self.where):
            async with self.engine.begin() as conn:
                return await conn.run_sync(statement, *args)

    @asynccontextmanager
    async def message(
        self, handler: Callable[[AsyncTransaction], Awaitable[object]]
    ) -> AsyncIterator[AsyncMessageRun]:
        """A delivery's steps (``relay.inbox.steps.Doer``, awaited), ``handler`` run in the
        message's transaction; whatever they leave open is rolled back at the end."""
        run = AsyncMessageRun(self, handler)
        if self._run_lock is not None:
            await self._run_lock.acquire()
        try:
            yield run
        finally:
            try:
                await run.rollback(discard=False)
            finally:
                if self._run_lock is not None:
                    self._run_lock.release()

    async def close(self) -> None:
        await self.engine.dispose()
        # aiomysql closes a connection's socket at the loop's next turn: a handler's
        # SystemExit on its way out ended the loop before it, and left the sockets open.
        await asyncio.sleep(0)
        if self._run_lock is not None:
            self._run_lock.close()


class AsyncMessageRun:
    """``relay.db.inbox.MessageRun`` on an asyncio engine."""

    def __init__(
        self, store: AsyncInboxStore, handler: Callable[[AsyncTransaction], Awaitable[object]]
    ) -> None:
        self._store = store
        self._handler = handler
        self._conn: AsyncConnection | None = None
        self._guarding = contextlib.ExitStack()  # ``relay.db.inbox.MessageRun``'s
        self._guard: Guard | None = None
        self.call = store.call

    async def open(self, key: str) -> bool:
        """``relay.db.inbox.MessageRun.open``: a connection that fails the key's insert is
        discarded."""
        try:
            with db_errors("the inbox's transaction", self._store.where):
                self._conn = await self._store.engine.connect()
                await self._conn.begin()
                return await self._add_key(self._conn, key)
        except StoreError:
            if self._conn is not None:
                await self._release(discard=True)
            raise

    async def _add_key(self, conn: AsyncConnection, message_id: str) -> bool:
        """``InboxStatements.add_key``; on psycopg's asyncio connection awaited on the driver
        itself (as the blocking store does: a statement through SQLAlchemy, and its hop into
        ``run_sync``, cost more than a tenth of a delivery)."""
        statements = self._store.statements
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        if not isinstance(driver, psycopg.AsyncConnection):
            return await conn.run_sync(statements.add_key, message_id)
        key = statements.key_row(message_id)
        sql = statements.key_sql
        try:
            cursor = await driver.execute(sql, key)
            return statements.inserted(self._sync(), await cursor.fetchone())
        except psycopg.Error as exc:
            raise sa.exc.DBAPIError.instance(sql, key, exc, psycopg.Error) from exc

    async def handle(self) -> Exception | None:
        """``relay.db.inbox.MessageRun.handle``."""
        conn = self._sync()
        guard = self._guard = self._guarding.enter_context(self._store.guards.running(conn))
        try:
            with self._store.statements.database.watched(conn), kept_off(conn, guard):
                await self._handler(AsyncTransaction(self._held(), guard))
        except BaseException as exc:  # an interruption's end-of-run checks too
            return handler_failed(exc, conn, self._store.where, guard)
        finally:
            guard.returned = True
        return guard.refused

    async def went_on(self) -> bool:
        """``relay.db.inbox.MessageRun.went_on``."""
        conn = self._sync()
        with classified(LOOKING, self._store.where, conn), own(self._guard):
            seen = await self._held().run_sync(went_on_here)
        if seen is not None:
            return seen
        return not await self.call(LOOKING, *holds_inbox(conn))

    async def execute(self, what: str, statement: Callable[..., T], *args: Any) -> T:
        with classified(what, self._store.where, self._sync()), own(self._guard):
            return await self._held().run_sync(statement, *args)

    async def commit(self) -> None:
        """``relay.db.inbox.MessageRun.commit``; on psycopg's asyncio connection its COMMIT
        awaited on the driver, its status read (``InboxStatements.commit``)."""
        conn = self._held()
        try:
            with classified("the inbox's commit", self._store.where, self._sync()):
                with own(self._guard):
                    committed = await self._commit(conn)
                if not committed:
                    raise TransactionFailed(ROLLED_BACK, summary=ROLLED_BACK)
        finally:
            await self._release(discard=False, failed=False)

    async def _commit(self, conn: AsyncConnection) -> bool:
        raw = await conn.get_raw_connection()
        driver = raw.driver_connection
        if not isinstance(driver, psycopg.AsyncConnection):
            return await conn.run_sync(self._store.statements.commit)
        sql = self._store.statements.commit_sql(self._sync(), driver)
        try:
            status = last_status(await driver.execute(sql))
        except psycopg.Error as exc:
            raise sa.exc.DBAPIError.instance(sql, None, exc, psycopg.Error) from exc
        await conn.commit()  # SQLAlchemy's: psycopg sends nothing, its transaction over
        return status == COMMIT

    async def rollback(self, discard: bool) -> bool:
        return self._conn is not None and await self._release(discard)

    def _held(self) -> AsyncConnection:
        assert self._conn is not None
        return self._conn

    def _sync(self) -> sa.Connection:
        conn = self._held().sync_connection
        assert conn is not None
        return conn

    async def _release(self, discard: bool, failed: bool = True) -> bool:
        """``relay.db.inbox.MessageRun._release``: never raises."""
        conn, self._conn = self._conn, None
        assert conn is not None
        sync = conn.sync_connection
        kept = False
        try:
            with own(self._guard):
                alive = sync is not None and not sync.invalidated
                if failed and alive and self._guard is not None:
                    kept = await conn.run_sync(kept_by_rollback)
                if alive and await conn.run_sync(spoilt, discard):
                    await conn.invalidate()  # rolled back by the server as it closes
                await conn.close()
        except sa.exc.SQLAlchemyError:
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                await conn.invalidate()
        finally:
            self._guard = None
            self._guarding.close()  # the guard's last: the connection is the pool's now
        return kept
