"""The inbox's test helpers: a topology with a dead-letter queue, a publisher, a handler that
records its effects (for each kind of inbox), a consumer of each kind in a thread, and what
it processed."""

from __future__ import annotations

import asyncio
import collections
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import pika
import sqlalchemy as sa
from faststream import Context
from faststream.rabbit import Channel, RabbitBroker, RabbitMessage, RabbitQueue, RabbitRouter

from relay.broker.aio_consumer import delivery_of
from relay.db.engine import create_engine
from relay.db.inbox import InboxStore
from relay.db.inbox_async import AsyncTransaction
from relay.db.inbox_transaction import Transaction
from relay.inbox import Delivery, Inbox, InboxSettings, Settings
from relay.inbox.aio import AsyncInbox
from relay.inbox.faststream import TRANSACTION, inbox_lifespan, inbox_middleware
from relay.inbox.policy import dead_letter_queue
from tests.support.inprocess import settings
from tests.support.metrics import sample_value

effects = sa.Table(
    "effects",
    sa.MetaData(),
    sa.Column("consumer", sa.String(64)),
    sa.Column("message_id", sa.String(255)),
)


def with_table(url: str, table: sa.Table) -> str:
    """``url``, once ``table`` (where a test's handlers write) is created there."""
    engine = create_engine(url)
    table.create(engine)
    engine.dispose()
    return url


def topology(url: str, queues: int = 1) -> tuple[str, list[str], str]:
    """(exchange, its queues, the first queue's inbox dead-letter queue): a fanout exchange,
    ``queues`` queues bound to it, each with the queue the inbox dead-letters it to (declared
    here for the test to read before the first dead letter) and a dead-letter exchange of
    the broker's own (for what the broker drops)."""
    suffix = uuid.uuid4().hex[:8]
    exchange, broker_dead = f"inbox.x.{suffix}", f"inbox.dead.{suffix}"
    names = [f"inbox.q{n}.{suffix}" for n in range(queues)]
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        channel = conn.channel()
        channel.exchange_declare(exchange, "fanout", durable=True)
        channel.exchange_declare(broker_dead, "fanout", durable=True)
        channel.queue_declare(broker_dead, durable=True)
        channel.queue_bind(broker_dead, broker_dead)
        for queue in names:
            arguments = {"x-dead-letter-exchange": broker_dead}
            channel.queue_declare(queue, durable=True, arguments=arguments)
            channel.queue_bind(queue, exchange)
            channel.queue_declare(dead_letter_queue(queue), durable=True)
    return exchange, names, dead_letter_queue(names[0])


def publish(
    url: str,
    exchange: str,
    messages: Sequence[tuple[str | bytes | None, Mapping[str, object]]],
) -> None:
    """(message id, headers) pairs, each published as it is, with confirms."""
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        channel = conn.channel()
        channel.confirm_delivery()
        for message_id, headers in messages:
            properties = pika.BasicProperties(
                message_id=message_id, headers=dict(headers), delivery_mode=2
            )
            channel.basic_publish(exchange, "", b"{}", properties)


class Recorder:
    """A handler for each kind of inbox that writes an effect row per message (in the inbox's
    transaction) and raises for the deliveries ``fail`` picks; ``calls`` counts its calls per
    key, whichever inbox called."""

    def __init__(self, consumer: str, fail: Callable[[Delivery], bool]) -> None:
        self.consumer = consumer
        self.fail = fail
        self.calls: collections.Counter[str] = collections.Counter()

    def _effect(self, delivery: Delivery) -> dict[str, str]:
        assert delivery.key is not None
        self.calls[delivery.key] += 1
        return {"consumer": self.consumer, "message_id": delivery.key}

    def __call__(self, delivery: Delivery, tx: Transaction) -> None:
        tx.execute(effects.insert(), self._effect(delivery))
        if self.fail(delivery):
            raise ValueError("cannot process this one")

    async def aio(self, delivery: Delivery, tx: AsyncTransaction) -> None:
        await tx.execute(effects.insert(), self._effect(delivery))
        if self.fail(delivery):
            raise ValueError("cannot process this one")


def recording(
    consumer: str, fail: Callable[[Delivery], bool] = lambda _d: False
) -> tuple[Recorder, collections.Counter[str]]:
    """A ``Recorder`` and its count of calls per key."""
    recorder = Recorder(consumer, fail)
    return recorder, recorder.calls


AnyInbox = Inbox | AsyncInbox


@contextmanager
def consuming(
    database_url: str,
    amqp_url: str,
    queue: str,
    handler: Callable[[Delivery, Transaction], None] | Recorder,
    flavour: str = "blocking",
    **inbox: str,
) -> Iterator[AnyInbox]:
    """An inbox of ``flavour`` consuming ``queue`` in a thread of its own while the block
    runs (an asyncio one on an event loop of its own); stopped, and its thread ended, after."""
    config = InboxSettings.load({}, {"inbox_queue": queue, **inbox})
    relay_settings = settings(database_url, amqp_url, backoff_initial=0.05)
    if flavour == "blocking":
        consumer = Inbox(relay_settings, config)
        stop = threading.Event()
        thread = threading.Thread(target=consumer.run, args=(handler, stop))
        thread.start()
        try:
            yield consumer
        finally:
            stop.set()
            thread.join(30)
            assert not thread.is_alive()
        return
    assert isinstance(handler, Recorder), "an asyncio inbox needs a Recorder's handler"
    loop = asyncio.new_event_loop()
    aconsumer = loop.run_until_complete(_async_inbox(relay_settings, config))
    astop = loop.run_until_complete(_event())
    main = _faststream if flavour == "faststream" else _aio_pika
    thread = threading.Thread(
        target=loop.run_until_complete, args=(main(aconsumer, handler, astop),)
    )
    thread.start()
    try:
        yield aconsumer
    finally:
        loop.call_soon_threadsafe(astop.set)
        thread.join(30)
        assert not thread.is_alive()
        loop.close()


async def _async_inbox(relay_settings: Settings, config: InboxSettings) -> AsyncInbox:
    return AsyncInbox(relay_settings, config)  # its engine made on the loop it runs on


async def _event() -> asyncio.Event:
    return asyncio.Event()


async def _aio_pika(inbox: AsyncInbox, handler: Recorder, stop: asyncio.Event) -> None:
    await inbox.run(handler.aio, stop)


async def _faststream(inbox: AsyncInbox, handler: Recorder, stop: asyncio.Event) -> None:
    """The inbox's queue consumed by one FastStream subscriber that runs ``handler``."""
    router = inbox_router(inbox)

    @router.subscriber(RabbitQueue(inbox.inbox.inbox_queue, declare=False))
    async def handle(
        message: RabbitMessage,  # FastStream's annotation: the message from its context
        tx: AsyncTransaction = Context(TRANSACTION),
    ) -> None:
        await handler.aio(delivery_of(message.raw_message), tx)

    await serve_faststream(inbox, router, stop)


def inbox_router(inbox: AsyncInbox) -> RabbitRouter:
    """A router with the inbox's middleware, for the subscriber of the inbox's queue (which
    the test's topology declared: ``RabbitQueue(..., declare=False)``)."""
    return RabbitRouter(middlewares=[inbox_middleware(inbox)])


async def serve_faststream(
    inbox: AsyncInbox, router: RabbitRouter, stop: asyncio.Event, prefetch: int | None = None
) -> None:
    """A FastStream broker serving ``router`` (``inbox_router``'s, its subscribers added),
    the inbox's lifespan around it, until ``stop``; its channels' prefetch, if given."""
    channel = None if prefetch is None else Channel(prefetch_count=prefetch)
    broker = RabbitBroker(inbox.settings.amqp_urls[0], logger=None, default_channel=channel)
    broker.include_router(router)
    async with inbox_lifespan(inbox)():
        await broker.start()
        try:
            await stop.wait()
        finally:
            await broker.stop()


def processed(database_url: str) -> collections.Counter[tuple[str, str]]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return collections.Counter(
                (row.consumer, row.message_id) for row in conn.execute(sa.select(effects))
            )
    finally:
        engine.dispose()


def attempts(database_url: str, consumer: str, key: str) -> int:
    """The failed attempts the inbox counted for ``key`` under ``consumer``."""
    store = InboxStore(database_url, consumer)
    try:
        return store.attempts(key)
    finally:
        store.close()


def waiting(url: str, queue: str) -> int:
    """Messages ready in ``queue`` (a dead-letter queue, which nothing consumes): the letters
    published there, which the consumer's metric counts a moment before."""
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        return int(conn.channel().queue_declare(queue, passive=True).method.message_count)


def copies(consumer: AnyInbox, expected: int) -> bool:
    return value(consumer, "inbox_duplicates_total") == expected


def at_least(calls: collections.Counter[str], handled: int) -> bool:
    return sum(calls.values()) >= handled


def value(consumer: AnyInbox, name: str, **labels: str) -> float:
    return sample_value(consumer.metrics, name, consumer=consumer.inbox.inbox_consumer, **labels)
