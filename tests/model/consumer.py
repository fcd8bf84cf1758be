"""An inbox consumer of one front end (blocking, asyncio, FastStream) whose handler does what
each message's script says (``tests.support.inbox_model``), run as a process of its own (a
forkserver's child: started in milliseconds, SIGKILLed from inside a handler).

A message's body is ``{"script": [...], "card": ...}``; its ``n``-th run takes the script's
``n``-th outcome (after the last, it returns). Each run is appended to ``runs/<key>`` in the
consumer's directory before it does anything, so the test knows every run, even one that
died. A run asks for its connection to the broker (``lost_ack``) or to the database
(``db_away``) to be cut by making a file the test's proxy watches."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from faststream import Context
from faststream.rabbit import RabbitMessage, RabbitQueue

from relay.broker.aio_consumer import delivery_of
from relay.db.inbox_async import AsyncTransaction
from relay.db.inbox_transaction import Transaction, TransactionEnded
from relay.inbox import Delivery, Inbox, InboxSettings, Settings
from relay.inbox.aio import AsyncInbox
from relay.inbox.faststream import TRANSACTION
from relay.logs import configure
from tests.support.inbox import inbox_router, serve_faststream
from tests.support.inbox_model import (
    COMMIT_RAISE,
    DB_AWAY,
    DDL_COMMIT,
    DIE,
    DOOR_RETURN,
    DUPLICATE,
    LISTEN_RETURN,
    LOST_ACK,
    RAISE,
    RETURN,
    ROLLBACK_RETURN,
    SQL_COMMIT,
    SWALLOW_RETURN,
    UNTRACED_RAISE,
)

metadata = sa.MetaData()
# Issue 71's door: a transaction's end in a construct other than SQL text.
DDL: Callable[[str], Any] = sa.DDL
# Each run's writes: "full" (the message's effect), "part" (what a run that ends the
# transaction, or tries to, writes before it).
effects = sa.Table(
    "model_effects",
    metadata,
    sa.Column("consumer", sa.String(100), nullable=False),
    sa.Column("message_id", sa.String(100), nullable=False),
    sa.Column("note", sa.String(10), nullable=False),
)
# A unique value a ``duplicate`` run inserts twice: the database's error quotes it.
cards = sa.Table("model_cards", metadata, sa.Column("pan", sa.String(32), unique=True))


class Failed(ValueError):
    """A ``raise`` run's exception; its message quotes the message's card number."""


@dataclass(frozen=True)
class Where:
    """A consumer's directory: its runs, its log, and the files its proxies watch."""

    root: Path

    @property
    def runs(self) -> Path:
        return self.root / "runs"

    @property
    def broker_cut(self) -> Path:
        return self.root / "cut-broker"

    @property
    def database_cut(self) -> Path:
        return self.root / "cut-database"


class Runs:
    """Which outcome a run of a message takes: the next of its script."""

    def __init__(self, where: Where, consumer: str) -> None:
        self.where = where
        self.consumer = consumer

    def next(self, delivery: Delivery) -> tuple[str, str, str]:
        """(the run's outcome, the message's key, its card number), the run recorded."""
        key = str(delivery.key)
        message = json.loads(delivery.body)
        log = self.where.runs / key
        with log.open("a") as runs:
            runs.write(f"{os.getpid()}\n")
        run = len(log.read_text().splitlines())
        script: list[str] = message["script"]
        outcome = script[run - 1] if run <= len(script) else RETURN
        return outcome, key, str(message["card"])


def listen(conn: sa.Connection) -> None:
    """``LISTEN_RETURN``'s listener: the driver's rollback at the inbox's own commit, which
    then commits nothing."""

    def rolls_back(listened: sa.Connection) -> None:
        driver = listened.connection.dbapi_connection  # the asyncio driver's adapted too
        assert driver is not None
        driver.rollback()

    sa.event.listen(conn, "commit", rolls_back)


def own_log(_statement: str) -> None:
    """``UNTRACED_RAISE``'s trace callback: a handler's own statement log, logging nothing."""


def part_sql(consumer: str, key: str) -> str:
    """``UNTRACED_RAISE``'s part, written through the driver (the test's own names, inlined)."""
    return (
        f"INSERT INTO {effects.name} (consumer, message_id, note) "
        f"VALUES ('{consumer}', '{key}', 'part')"
    )


def blocking_handler(runs: Runs) -> Any:
    def handle(delivery: Delivery, tx: Transaction) -> None:
        outcome, key, card = runs.next(delivery)
        effect = {"consumer": runs.consumer, "message_id": key, "note": "full"}
        driver = tx._conn.connection.driver_connection
        assert driver is not None
        if outcome == DB_AWAY:
            runs.where.database_cut.touch()
            tx.execute(sa.text("SELECT 1"))
        if outcome in (COMMIT_RAISE, DDL_COMMIT, DOOR_RETURN):
            result = tx.execute(effects.insert(), {**effect, "note": "part"})
            if outcome == DOOR_RETURN:
                with contextlib.suppress(TransactionEnded):
                    result.context.root_connection.commit()
            else:
                if outcome == COMMIT_RAISE:
                    driver.commit()
                else:
                    tx.execute(DDL("COMMIT"))
                raise Failed(f"charging card {card} failed")
        if outcome == UNTRACED_RAISE:
            if hasattr(driver, "set_trace_callback"):
                driver.set_trace_callback(own_log)
            driver.rollback()
            driver.cursor().execute(part_sql(runs.consumer, key))
            driver.commit()
            raise Failed(f"charging card {card} failed")
        tx.execute(effects.insert(), effect)
        if outcome == RAISE:
            raise Failed(f"charging card {card} failed")
        if outcome == DUPLICATE:
            tx.execute(cards.insert(), [{"pan": card}, {"pan": card}])
        elif outcome == DIE:
            os.kill(os.getpid(), signal.SIGKILL)
        elif outcome == SQL_COMMIT:
            tx.execute("/* settle */ COMMIT")
        elif outcome == ROLLBACK_RETURN:
            driver.rollback()
            tx.execute(effects.insert(), effect)
        elif outcome == LISTEN_RETURN:
            listen(tx.execute(sa.select(1)).context.root_connection)
        elif outcome == SWALLOW_RETURN:
            with contextlib.suppress(sa.exc.DBAPIError):
                tx.execute(sa.text("SELECT * FROM no_such_table"))
        elif outcome == LOST_ACK:
            runs.where.broker_cut.touch()

    return handle


def async_handler(runs: Runs) -> Any:
    async def handle(delivery: Delivery, tx: AsyncTransaction) -> None:
        outcome, key, card = runs.next(delivery)
        effect = {"consumer": runs.consumer, "message_id": key, "note": "full"}
        driver = (await tx._conn.get_raw_connection()).driver_connection
        assert driver is not None
        if outcome == DB_AWAY:
            runs.where.database_cut.touch()
            await tx.execute(sa.text("SELECT 1"))
        if outcome in (COMMIT_RAISE, DDL_COMMIT, DOOR_RETURN):
            await tx.execute(effects.insert(), {**effect, "note": "part"})
            if outcome == DOOR_RETURN:
                with contextlib.suppress(TransactionEnded):
                    await tx._conn.commit()
            else:
                if outcome == COMMIT_RAISE:
                    await driver.commit()
                else:
                    await tx.execute(DDL("COMMIT"))
                raise Failed(f"charging card {card} failed")
        if outcome == UNTRACED_RAISE:
            if hasattr(driver, "set_trace_callback"):
                await driver.set_trace_callback(own_log)
            await driver.rollback()
            cursor = driver.cursor()
            cursor = await cursor if inspect.isawaitable(cursor) else cursor
            await cursor.execute(part_sql(runs.consumer, key))
            await driver.commit()
            raise Failed(f"charging card {card} failed")
        await tx.execute(effects.insert(), effect)
        if outcome == RAISE:
            raise Failed(f"charging card {card} failed")
        if outcome == DUPLICATE:
            await tx.execute(cards.insert(), [{"pan": card}, {"pan": card}])
        elif outcome == DIE:
            os.kill(os.getpid(), signal.SIGKILL)
        elif outcome == SQL_COMMIT:
            await tx.execute("/* settle */ COMMIT")
        elif outcome == ROLLBACK_RETURN:
            await driver.rollback()
            await tx.execute(effects.insert(), effect)
        elif outcome == LISTEN_RETURN:
            listen((await tx.execute(sa.select(1))).context.root_connection)
        elif outcome == SWALLOW_RETURN:
            with contextlib.suppress(sa.exc.DBAPIError):
                await tx.execute(sa.text("SELECT * FROM no_such_table"))
        elif outcome == LOST_ACK:
            runs.where.broker_cut.touch()

    return handle


def serve(flavour: str, environ: dict[str, str], root: str, prefetch: int) -> None:
    """A forkserver child's target: consume until SIGTERM with ``flavour``'s inbox, settings
    from ``environ``, logs (JSON) into ``root``'s log file."""
    where = Where(Path(root))
    log = (where.root / "consumer.log").open("a")
    os.dup2(log.fileno(), sys.stderr.fileno())
    settings = Settings.load(environ)
    inbox_settings = InboxSettings.load(environ)
    configure(settings.log_level, "json")
    logging.getLogger(__name__).info("started", extra={"action": "model_consumer_started"})
    runs = Runs(where, inbox_settings.inbox_consumer)
    if flavour == "blocking":
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        Inbox(settings, inbox_settings).run(blocking_handler(runs), stop)
        return
    asyncio.run(_serve_async(flavour, settings, inbox_settings, runs, prefetch))


async def _serve_async(
    flavour: str, settings: Settings, inbox_settings: InboxSettings, runs: Runs, prefetch: int
) -> None:
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    inbox = AsyncInbox(settings, inbox_settings)
    handler = async_handler(runs)
    if flavour == "asyncio":
        await inbox.run(handler, stop)
        return
    router = inbox_router(inbox)

    @router.subscriber(RabbitQueue(inbox_settings.inbox_queue, declare=False))
    async def handle(message: RabbitMessage, tx: AsyncTransaction = Context(TRANSACTION)) -> None:
        await handler(delivery_of(message.raw_message), tx)

    await serve_faststream(inbox, router, stop, prefetch)
