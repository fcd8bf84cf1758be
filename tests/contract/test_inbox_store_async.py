"""The inbox's database side for asyncio (``relay.db.inbox_async``) on SQLite, PostgreSQL and
MariaDB: its run keeps the blocking store's contract (a key once, with its transaction's
writes or not at all; a transaction the handler cannot end; one ended through the driver
found), with durable and bounded sessions. Its other statements are the blocking store's
own (``InboxStatements``), run through ``run_sync``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
import sqlalchemy as sa

from devtools.servers import PostgresServer
from relay.db.engine import create_engine
from relay.db.inbox import Outcome, TransactionEnded
from relay.db.inbox_async import AsyncInboxStore, AsyncTransaction
from tests.support.inbox import with_table

T = TypeVar("T")
effects = sa.Table("effects", sa.MetaData(), sa.Column("note", sa.String(64)))


@pytest.fixture
def with_effects(database_url: str) -> str:
    return with_table(database_url, effects)


def on_store(url: str, use: Callable[[AsyncInboxStore], Awaitable[T]]) -> T:
    """``use`` on a store of consumer "billing" made, used and closed on one event loop."""

    async def scenario() -> T:
        store = AsyncInboxStore(url, "billing")
        try:
            return await use(store)
        finally:
            await store.close()

    return asyncio.run(scenario())


def noted(url: str) -> list[str]:
    engine = create_engine(url)
    with engine.connect() as conn:
        notes = sorted(conn.scalars(sa.select(effects.c.note)))
    engine.dispose()
    return notes


def note(text: str, fail: bool = False) -> Callable[[AsyncTransaction], Awaitable[None]]:
    async def handler(tx: AsyncTransaction) -> None:
        await tx.execute(effects.insert(), {"note": text})
        if fail:
            raise RuntimeError("the handler failed")

    return handler


def test_a_key_goes_in_once_with_its_transactions_writes(with_effects: str) -> None:
    async def use(store: AsyncInboxStore) -> list[Outcome]:
        return [
            (await store.run("m-1", note("first"))).outcome,
            (await store.run("m-1", note("twice"))).outcome,
            (await store.run("m-2", note("rolled back", fail=True))).outcome,
            (await store.run("m-2", note("second"))).outcome,  # its key went with the rollback
        ]

    outcomes = on_store(with_effects, use)
    assert outcomes == [Outcome.DONE, Outcome.DUPLICATE, Outcome.FAILED, Outcome.DONE]
    assert noted(with_effects) == ["first", "second"]


def test_the_handlers_transaction_cannot_be_ended_by_the_handler(with_effects: str) -> None:
    """No ``commit``, ``rollback`` or ``close``; a transaction statement as SQL text refused
    (a failure: the whole transaction and its key rolled back); a savepoint undoes a part."""
    seen: list[int] = []

    async def handler(tx: AsyncTransaction) -> None:
        await tx.execute(effects.insert(), {"note": "before"})
        for method in ("commit", "rollback", "close", "begin"):
            assert not hasattr(tx, method)
        async with tx.savepoint():
            await tx.execute(effects.insert(), {"note": "kept"})
        with contextlib.suppress(RuntimeError):
            async with tx.savepoint():
                await tx.execute(effects.insert(), {"note": "undone"})
                raise RuntimeError("a part failed")
        seen.append(await tx.scalar(sa.select(sa.func.count()).select_from(effects)))
        await tx.execute("  commit")

    async def use(store: AsyncInboxStore) -> list[Any]:
        first = await store.run("m-1", handler)
        again = await store.run("m-1", note("again"))
        return [first.outcome, type(first.error), again.outcome]

    assert on_store(with_effects, use) == [Outcome.FAILED, TransactionEnded, Outcome.DONE]
    assert seen == [2]
    assert noted(with_effects) == ["again"]


@pytest.mark.databases("postgresql", "sqlite")
def test_a_transaction_ended_through_the_driver_is_found(with_effects: str) -> None:
    async def commit_through_the_driver(tx: AsyncTransaction) -> None:
        await tx.execute(effects.insert(), {"note": "committed early"})
        raw = await tx._conn.get_raw_connection()
        await raw.driver_connection.commit()  # type: ignore[union-attr]

    async def use(store: AsyncInboxStore) -> Outcome:
        return (await store.run("m-1", commit_through_the_driver)).outcome

    assert on_store(with_effects, use) is Outcome.ENDED


@pytest.mark.databases("postgresql")
def test_the_sessions_are_durable_and_bounded_whatever_the_servers_default(
    with_effects: str, postgres: PostgresServer
) -> None:
    database = sa.make_url(with_effects).database
    postgres.psql(f"ALTER DATABASE {database} SET synchronous_commit = off")
    shown: dict[str, str] = {}

    async def show(tx: AsyncTransaction) -> None:
        for name in ("synchronous_commit", "lock_timeout", "statement_timeout"):
            shown[name] = await tx.scalar(sa.text(f"SHOW {name}"))

    async def use(store: AsyncInboxStore) -> str | None:
        await store.run("m-1", show)
        return await store.call("durability", store.statements.durability)

    assert on_store(with_effects, use) is None
    assert shown == {"synchronous_commit": "on", "lock_timeout": "5s", "statement_timeout": "30s"}
