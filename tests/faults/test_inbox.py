"""The inbox against the relay's own faults: a relay SIGKILLed mid-stream and restarted, an
inbox consumer SIGKILLed inside its handler and restarted, every connection closed by the
broker, and every message replayed (``relay replay --sent``): the consumer's effects are
exactly once per message.

The consumer is examples/inbox_consumer.py (order events into per-order totals) as a
subprocess (tests/faults/inbox_consumer.py), which also records each message it processes
in a table without a unique key, where a message processed twice would show twice."""

from __future__ import annotations

import collections
import contextlib
import functools
import sys
import threading
import time
import uuid
from pathlib import Path

import pika
import pytest
import sqlalchemy as sa

from devtools.broker import drain
from devtools.outbox import insert, statuses
from devtools.relayproc import RelayProcess, no_leaks, relay, relay_env
from devtools.scrape import http_get
from devtools.servers import PostgresServer, RabbitNode, ServerError, free_port, wait_until
from relay.db.engine import create_engine
from relay.records import SENT
from tests.faults.harness import EXCHANGE, QUEUE, FaultRelay, connected
from tests.support.inbox import (
    AnyInbox,
    consuming,
    effects,
    processed,
    recording,
    value,
)
from tests.support.inbox_model import FLAVOURS

# A hang detector, not a speed limit, as the relay's fault scenarios' (tests/faults/
# test_faults.py): the slowest here took 78 s alone, and a busy machine takes three times that.
pytestmark = pytest.mark.timeout(420)
ORDERS = 1000
EVENTS = ("created", "paid", "shipped")
MESSAGES = ORDERS * len(EVENTS)
HOLD = "order-500-paid"  # the consumer is killed inside its handler of this one
ORDERS_PER_WRITE = 10  # a writer's transaction: 30 rows, every WRITE_PAUSE_S
WRITE_PAUSE_S = 0.03
# The consumers' heartbeat (seconds, asked for in the AMQP URL) and how long the database is
# away: three heartbeat timeouts, so that a consumer that stops servicing its connection while
# it waits is closed by the broker (RabbitMQ's default of 60 s made the test a minute longer).
HEARTBEAT_S = 10
DATABASE_AWAY_S = 3 * HEARTBEAT_S


def order_events(first: int, last: int) -> list[dict[str, object]]:
    return [
        {
            "message_id": f"order-{order}-{event}",
            "exchange": EXCHANGE,
            "routing_key": f"order.{event}",
            "content_type": "application/json",
            "payload": f'{{"order_id": {order}, "event": "{event}", "amount_cents": {order}}}',
        }
        for order in range(first, last)
        for event in EVENTS
    ]


def write_orders(url: str, stop: threading.Event) -> None:
    engine = create_engine(url)
    try:
        for first in range(0, ORDERS, ORDERS_PER_WRITE):
            insert(engine, order_events(first, first + ORDERS_PER_WRITE))
            if stop.wait(WRITE_PAUSE_S):
                return
    finally:
        engine.dispose()


def consumer_metric(port: int, name: str) -> float:
    """An inbox metric of the running consumer (0 while it is not serving yet)."""
    try:
        text = http_get(f"http://127.0.0.1:{port}/metrics")[1]
    except OSError:
        return 0.0
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rpartition(" ")[2])
    return 0.0


def sent(url: str) -> int:
    return statuses(url).get(SENT, 0)


@pytest.mark.parametrize("database_url", ["postgresql", "mariadb"], indirect=True)
def test_every_message_is_processed_once_whoever_is_killed(
    database_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    conn.channel().queue_delete(QUEUE)
    conn.close()
    relays = [
        FaultRelay(f"inbox-relay-{n}", tmp_path, database_url, rabbit.url, keep_sent="messages")
        for n in range(2)
    ]
    port = free_port()
    env = relay_env(
        RELAY_DATABASE_URL=database_url,
        RELAY_AMQP_URL=rabbit.url,
        RELAY_INBOX_QUEUE=QUEUE,
        RELAY_METRICS_HOST="127.0.0.1",
        RELAY_METRICS_PORT=str(port),
        RELAY_BACKOFF_INITIAL="0.1",
        RELAY_RECONNECT_MAX="1",
        RELAY_LOG_FORMAT="json",
    )
    marker = tmp_path / "held"
    command = [sys.executable, "-m", "tests.faults.inbox_consumer", HOLD, str(marker)]
    consumers = [RelayProcess(env, tmp_path / f"consumer-{n}.log", command) for n in range(2)]
    stop = threading.Event()
    writer = threading.Thread(target=write_orders, args=(database_url, stop))
    try:
        relays[0].start()
        wait_until(functools.partial(connected, relays[0]), 60, "the relay connected")
        consumers[0].start()
        writer.start()
        # The relay killed with rows published and not settled: its successor publishes them
        # again once the lease of the dead one's buckets has run out.
        wait_until(lambda: sent(database_url) >= MESSAGES // 3, 60, "a third of the rows sent")
        relays[0].kill()
        relays[1].start()
        # The consumer killed inside its handler: the transaction rolls back, the broker
        # delivers the message again to its successor.
        wait_until(marker.exists, 120, "the consumer holding its message")
        consumers[0].kill()
        consumers[1].start()
        # Every connection closed by the broker while its successor works: its unacked
        # deliveries (and the relay's unconfirmed rows) come again.
        wait_until(
            lambda: consumer_metric(port, "inbox_processed_total") >= 100, 60, "consuming again"
        )
        rabbit.ctl("close_all_connections", "inbox fault test")
        writer.join(60)
        wait_until(lambda: sent(database_url) == MESSAGES, 120, "every row sent")
        replayed = relay("replay", "--sent", "--all", env=relays[1].env)
        assert replayed.returncode == 0, replayed.stderr
        wait_until(
            lambda: consumer_metric(port, "inbox_duplicates_total") >= MESSAGES,
            120,
            "every replayed copy acked as a duplicate",
        )
        duplicates = consumer_metric(port, "inbox_duplicates_total")
    finally:
        stop.set()
        for process in [*relays, *consumers]:
            if process.running:
                process.end()
    for process in [*relays, *consumers]:
        no_leaks(process.command, process.log())
    engine = create_engine(database_url)
    try:
        with engine.connect() as db:
            processed = collections.Counter(db.scalars(sa.text("SELECT message_id FROM processed")))
            totals = db.execute(sa.text("SELECT order_id, events, paid_cents FROM order_totals"))
            totals_by_order = {row.order_id: (row.events, row.paid_cents) for row in totals}
    finally:
        engine.dispose()
    expected = [str(e["message_id"]) for e in order_events(0, ORDERS)]
    assert sorted(processed) == sorted(expected)
    assert [m for m, n in processed.items() if n != 1] == []
    assert totals_by_order == {order: (3, order) for order in range(ORDERS)}
    assert [p.tracebacks() for p in [*relays, *consumers]] == [[]] * 4
    print(f"inbox: {MESSAGES} messages, each processed once; duplicates acked: {duplicates:.0f}")


def test_the_database_away_for_heartbeats_pauses_consuming_and_loses_nothing(
    postgresql_url: str, postgres: PostgresServer, rabbit4: RabbitNode
) -> None:
    """PostgreSQL stopped (-m immediate) for three heartbeat timeouts (the connection must
    be serviced throughout) under a stream on a RabbitMQ 4 quorum queue whose
    delivery limit is 2, for each inbox at once (blocking, asyncio, FastStream; a queue and a
    stream each, one outage): each stops taking deliveries instead of requeueing each one,
    and resumes by itself. Nothing dead-lettered, dropped, or processed twice."""
    rabbit = rabbit4
    engine = create_engine(postgresql_url)
    effects.create(engine)
    ids = [f"m-{n}" for n in range(400)]
    beating = f"{rabbit.url}?heartbeat={HEARTBEAT_S}"
    queues = {flavour: quorum_queue(rabbit.url, flavour) for flavour in FLAVOURS}
    streams = [
        threading.Thread(target=publish_slowly, args=(rabbit.url, queue, ids))
        for queue, _dead in queues.values()
    ]
    with contextlib.ExitStack() as running:
        consumers = [
            running.enter_context(
                consuming(postgresql_url, beating, queue, recording(queue)[0], flavour)
            )
            for flavour, (queue, _dead) in queues.items()
        ]
        for stream in streams:
            stream.start()
        for consumer in consumers:
            wait_until(functools.partial(processed_at_least, consumer, 50), 30, "consuming")
        postgres.stop("immediate")
        time.sleep(DATABASE_AWAY_S)
        postgres.start()
        for stream in streams:
            stream.join(60)
        for flavour, consumer in zip(FLAVOURS, consumers, strict=True):
            try:
                wait_until(functools.partial(processed_at_least, consumer, len(ids)), 90, "all")
            except ServerError:
                # What the next look needs (a CI run under load failed here once, alone it
                # passes): each inbox's counts, and what the broker dead-lettered meanwhile.
                counts = {
                    name: [value(c, f"inbox_{name}_total") for c in consumers]
                    for name in ("processed", "database_errors", "duplicates")
                }
                for outcome in ("retried", "dead_lettered"):
                    counts[outcome] = [
                        value(c, "inbox_failures_total", outcome=outcome) for c in consumers
                    ]
                dead = [len(drain(rabbit.url, d, 0, timeout=1)) for _q, d in queues.values()]
                raise AssertionError(f"{flavour}: {counts}, dead-lettered {dead}") from None
        errors = [value(c, "inbox_database_errors_total") for c in consumers]
    assert all(1 <= e <= 5 for e in errors), f"{errors}: deliveries failed, not paused"
    assert [drain(rabbit.url, dead, 0, timeout=1) for _queue, dead in queues.values()] == [[]] * 3
    expected = {(queue, i): 1 for queue, _dead in queues.values() for i in ids}
    assert processed(postgresql_url) == expected
    engine.dispose()


def processed_at_least(consumer: AnyInbox, count: int) -> bool:
    return value(consumer, "inbox_processed_total") >= count


def quorum_queue(url: str, flavour: str) -> tuple[str, str]:
    """A new quorum queue whose delivery limit is 2, dead-lettering into a queue of its own:
    their names."""
    suffix = f"{flavour}.{uuid.uuid4().hex[:8]}"
    queue, dead = f"inbox.quorum.{suffix}", f"inbox.quorum.dead.{suffix}"
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.queue_declare(dead, durable=True)
    arguments = {
        "x-queue-type": "quorum",
        "x-delivery-limit": 2,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": dead,
    }
    channel.queue_declare(queue, durable=True, arguments=arguments)
    conn.close()
    return queue, dead


def publish_slowly(url: str, queue: str, ids: list[str]) -> None:
    """``ids`` into ``queue``, 25 a second, confirmed."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.confirm_delivery()
    for n, message_id in enumerate(ids):
        properties = pika.BasicProperties(message_id=message_id, delivery_mode=2)
        channel.basic_publish("", queue, b"{}", properties)
        if n % 5 == 4:
            conn.sleep(0.2)
    conn.close()
