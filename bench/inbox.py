"""Benchmark: a consumer through the inbox against a plain consumer that makes the same write.

    .venv/bin/python -m bench.inbox [--messages 5000] [--rounds 5] [--prefetch 50] [--only a,b]

Starts a private RabbitMQ node and PostgreSQL (default durability). In interleaved rounds,
``--messages`` persistent 200-byte messages are published to a fresh queue, then consumed
by one of these consumers in this process until the queue is drained:

- **plain**: pika's blocking consumer; per message, one transaction that inserts a row
  into the consumer's own table, then the ack (at-least-once, no dedupe);
- **inbox**: ``relay.inbox.Inbox`` with a handler that inserts the same row, in the
  transaction that holds the message's key (effectively once);
- **aplain** and **ainbox**: the same two on asyncio (aio-pika, SQLAlchemy's asyncio engine
  on psycopg's asyncio connection; ``relay.inbox.aio.AsyncInbox``).

All use the same prefetch and the inbox's engines (durable commits, no test query before
each use). Reported per consumer: messages per second (drain time), this process's CPU per
message and the database server's (every PostgreSQL process, from /proc); medians, each
inbox's rate over its stack's plain consumer's (and the asyncio inbox's over the blocking
plain one's), and last one JSON line. By hand only.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import aio_pika
import pika
import sqlalchemy as sa

from devtools.broker import fresh_queue
from devtools.procfs import tree_cpu_seconds
from devtools.servers import PostgresServer, RabbitNode
from relay.db.engine import create_async_engine, create_engine
from relay.db.inbox import InboxStore
from relay.db.inbox_async import AsyncTransaction
from relay.db.migrate import migrate
from relay.inbox import Delivery, Inbox, InboxSettings, Settings, Transaction
from relay.inbox.aio import AsyncInbox

QUEUE = "bench.inbox"
BODY = b"x" * 200
effects = sa.Table(
    "effects",
    sa.MetaData(),
    sa.Column("message_id", sa.Text(), nullable=False),
    sa.Column("body", sa.LargeBinary(), nullable=False),
)


def fill(amqp_url: str, messages: int, run: str) -> None:
    fresh_queue(amqp_url, QUEUE)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = conn.channel()
    channel.confirm_delivery()
    for n in range(messages):
        properties = pika.BasicProperties(message_id=f"{run}-{n}", delivery_mode=2)
        channel.basic_publish("", QUEUE, BODY, properties)
    conn.close()


def plain(
    database_url: str, amqp_url: str, messages: int, prefetch: int, *, with_key: bool = False
) -> None:
    """Per message: the write, commit, ack. ``with_key``: the inbox's key insert (its very
    statement) before the write, and nothing else of the inbox: what that costs by itself."""
    engine = create_engine(database_url, pre_ping=False)  # as the inbox's
    store = InboxStore(database_url, "bench")
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = conn.channel()
    channel.basic_qos(prefetch_count=prefetch)
    for done, (method, properties, body) in enumerate(channel.consume(QUEUE), start=1):
        message_id = properties.message_id
        with engine.begin() as db:
            if with_key:
                db.execute(
                    store.statements.insert_key, {"consumer": "bench", "message_id": message_id}
                )
            db.execute(effects.insert(), {"message_id": message_id, "body": body})
        channel.basic_ack(method.delivery_tag)
        if done == messages:
            break
    channel.cancel()
    conn.close()
    store.close()
    engine.dispose()


def through_inbox(database_url: str, amqp_url: str, messages: int, prefetch: int) -> None:
    settings = Settings.load({}, {"database_url": database_url, "amqp_url": amqp_url})
    config = InboxSettings.load({}, {"inbox_queue": QUEUE, "inbox_prefetch": str(prefetch)})
    inbox = Inbox(settings, config)
    stop = threading.Event()
    done = 0

    def handle(delivery: Delivery, tx: Transaction) -> None:
        nonlocal done
        tx.execute(effects.insert(), {"message_id": delivery.message_id, "body": delivery.body})
        done += 1
        if done == messages:
            stop.set()  # answered, then the consumer returns

    inbox.run(handle, stop)


def plain_async(database_url: str, amqp_url: str, messages: int, prefetch: int) -> None:
    """``plain`` on asyncio: aio-pika's consumer, SQLAlchemy's asyncio engine (the asyncio
    inbox's)."""

    async def consume() -> None:
        engine = create_async_engine(database_url)
        conn = await aio_pika.connect(amqp_url)
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=prefetch)
        queue = await channel.get_queue(QUEUE)
        done = 0
        async with queue.iterator() as deliveries:
            async for message in deliveries:
                async with engine.begin() as db:
                    row = {"message_id": message.message_id, "body": message.body}
                    await db.execute(effects.insert(), row)
                await message.ack()
                done += 1
                if done == messages:
                    break
        await conn.close()
        await engine.dispose()

    asyncio.run(consume())


def through_async_inbox(database_url: str, amqp_url: str, messages: int, prefetch: int) -> None:
    settings = Settings.load({}, {"database_url": database_url, "amqp_url": amqp_url})
    config = InboxSettings.load({}, {"inbox_queue": QUEUE, "inbox_prefetch": str(prefetch)})

    async def consume() -> None:
        inbox = AsyncInbox(settings, config)
        stop = asyncio.Event()
        done = 0

        async def handle(delivery: Delivery, tx: AsyncTransaction) -> None:
            nonlocal done
            row = {"message_id": delivery.message_id, "body": delivery.body}
            await tx.execute(effects.insert(), row)
            done += 1
            if done == messages:
                stop.set()  # answered, then the consumer returns

        await inbox.run(handle, stop)

    asyncio.run(consume())


CONSUMERS: dict[str, Callable[[str, str, int, int], None]] = {
    "plain": plain,
    "plain+key": functools.partial(plain, with_key=True),
    "inbox": through_inbox,
    "aplain": plain_async,
    "ainbox": through_async_inbox,
}
# Each inbox against the plain consumer of its own stack, and the asyncio one against the
# blocking plain consumer too.
RATIOS = {
    "plain+key/plain": ("plain+key", "plain"),
    "inbox/plain": ("inbox", "plain"),
    "ainbox/aplain": ("ainbox", "aplain"),
    "ainbox/plain": ("ainbox", "plain"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--prefetch", type=int, default=50)
    parser.add_argument(
        "--only", default=",".join(CONSUMERS), help="the consumers to run, comma-separated"
    )
    args = parser.parse_args()
    chosen = {name: CONSUMERS[name] for name in args.only.split(",")}
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in chosen}
    with tempfile.TemporaryDirectory() as tmp:
        node = RabbitNode(Path(tmp) / "rabbit", name="relay-bench-inbox")
        server = PostgresServer(Path(tmp) / "pg")
        node.start()
        server.start()
        try:
            database_url = server.url()
            migrate(database_url)
            engine = create_engine(database_url)
            effects.create(engine)
            for round_ in range(args.rounds):
                for name, consume in chosen.items():
                    fill(node.url, args.messages, f"{round_}-{name}")
                    with engine.begin() as conn:  # each round from empty tables
                        conn.execute(sa.text("TRUNCATE effects, inbox_received"))
                    database_cpu = tree_cpu_seconds(server.pid())
                    cpu, started = time.process_time(), time.perf_counter()
                    consume(database_url, node.url, args.messages, args.prefetch)
                    wall = time.perf_counter() - started
                    own = (time.process_time() - cpu) / args.messages * 1e6
                    db = (tree_cpu_seconds(server.pid()) - database_cpu) / args.messages * 1e6
                    figures[name].append((args.messages / wall, own, db))
                    print(
                        f"round {round_ + 1} {name:>9}: {args.messages / wall:7.0f} msg/s, "
                        f"consumer {own:5.0f} us/msg, database {db:5.0f} us/msg",
                        flush=True,
                    )
            engine.dispose()
        finally:
            server.stop()
            node.stop()
    medians = {
        name: [statistics.median(f[i] for f in rows) for i in range(3)]
        for name, rows in figures.items()
    }
    for name, (rate, own, db) in medians.items():
        print(f"median {name:>9}: {rate:7.0f} msg/s, consumer {own:5.0f} us, database {db:5.0f} us")
    ratios = {
        name: medians[a][0] / medians[b][0]
        for name, (a, b) in RATIOS.items()
        if a in medians and b in medians
    }
    for name, ratio in ratios.items():
        print(f"{name} rate: {ratio:.2f}")
    print(json.dumps({"medians": medians, "rate_ratios": ratios}))


if __name__ == "__main__":
    main()
