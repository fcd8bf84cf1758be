"""The inbox's test helpers: a topology with a dead-letter queue, a publisher, a handler that
records its effects, a consumer in a thread, and what it processed."""

from __future__ import annotations

import collections
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager

import pika
import sqlalchemy as sa

from relay.db.engine import create_engine
from relay.db.inbox import Transaction
from relay.inbox import Delivery, Inbox, InboxSettings
from relay.inbox.policy import dead_letter_queue
from tests.support.inprocess import settings
from tests.support.metrics import sample_value

effects = sa.Table(
    "effects",
    sa.MetaData(),
    sa.Column("consumer", sa.String(64)),
    sa.Column("message_id", sa.String(255)),
)


def topology(url: str, queues: int = 1) -> tuple[str, list[str], str]:
    """(exchange, its queues, the first queue's inbox dead-letter queue): a fanout exchange,
    ``queues`` queues bound to it, each with the queue the inbox dead-letters it to (declared
    here for the test to read before the first dead letter) and a dead-letter exchange of
    the broker's own (for what the broker drops)."""
    suffix = uuid.uuid4().hex[:8]
    exchange, broker_dead = f"inbox.x.{suffix}", f"inbox.dead.{suffix}"
    names = [f"inbox.q{n}.{suffix}" for n in range(queues)]
    conn = pika.BlockingConnection(pika.URLParameters(url))
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
    conn.close()
    return exchange, names, dead_letter_queue(names[0])


def publish(
    url: str, exchange: str, messages: Sequence[tuple[str | bytes | None, Mapping[str, str]]]
) -> None:
    """(message id, headers) pairs, each published as it is, with confirms."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.confirm_delivery()
    for message_id, headers in messages:
        properties = pika.BasicProperties(
            message_id=message_id, headers=dict(headers), delivery_mode=2
        )
        channel.basic_publish(exchange, "", b"{}", properties)
    conn.close()


def recording(
    consumer: str, fail: Callable[[Delivery], bool] = lambda _d: False
) -> tuple[Callable[[Delivery, Transaction], None], collections.Counter[str]]:
    """A handler that writes an effect row per message (in the inbox's transaction) and
    raises for the deliveries ``fail`` picks; and the count of its calls per key."""
    calls: collections.Counter[str] = collections.Counter()

    def handle(delivery: Delivery, tx: Transaction) -> None:
        assert delivery.key is not None
        calls[delivery.key] += 1
        tx.execute(effects.insert(), {"consumer": consumer, "message_id": delivery.key})
        if fail(delivery):
            raise ValueError("cannot process this one")

    return handle, calls


@contextmanager
def consuming(
    database_url: str,
    amqp_url: str,
    queue: str,
    handler: Callable[[Delivery, Transaction], None],
    **inbox: str,
) -> Iterator[Inbox]:
    config = InboxSettings.load({}, {"inbox_queue": queue, **inbox})
    consumer = Inbox(settings(database_url, amqp_url, backoff_initial=0.05), config)
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(handler, stop))
    thread.start()
    try:
        yield consumer
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()


def processed(database_url: str) -> collections.Counter[tuple[str, str]]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            return collections.Counter(
                (row.consumer, row.message_id) for row in conn.execute(sa.select(effects))
            )
    finally:
        engine.dispose()


def copies(consumer: Inbox, expected: int) -> bool:
    return value(consumer, "inbox_duplicates_total") == expected


def at_least(calls: collections.Counter[str], handled: int) -> bool:
    return sum(calls.values()) >= handled


def value(consumer: Inbox, name: str, **labels: str) -> float:
    return sample_value(consumer.metrics, name, consumer=consumer.inbox.inbox_consumer, **labels)
