"""Benchmark: the relay against a bare publisher and a naive relay, same broker, same run.

    .venv/bin/python -m bench.run [--rows 100000] [--naive-rows 5000] [--memory-rows 1000000]
                                  [--three-relays]

Starts a private RabbitMQ node and a private PostgreSQL (default durability settings) and
measures, with 200-byte persistent messages into one durable queue and the same window:
  (a) a bare pika asynchronous publisher with confirms (no database at all),
  (b) a naive relay: claim one row, publish, wait for its confirm, mark it sent,
  (c) ``relay run`` end to end, from committed outbox rows to rows marked sent, on
      PostgreSQL and on SQLite.
Prints a table of rows/s with the ratios c/a and c/b, then, with --memory-rows, the relay's
peak resident memory while it drains a backlog of that many rows; the last line is one JSON
object with every figure. By hand only: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

import pika
import sqlalchemy as sa
from pika.adapters.asyncio_connection import AsyncioConnection

from devtools.relayproc import RelayProcess, relay_env, rss_mb
from devtools.servers import PostgresServer, RabbitNode
from relay.db.engine import create_engine, migrate
from relay.db.schema import outbox

BODY = b"x" * 200
WINDOW = 1000


def declare(url: str, queue: str) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    ch = conn.channel()
    ch.queue_delete(queue)
    ch.queue_declare(queue, durable=True)
    conn.close()


def bare_publisher(url: str, queue: str, count: int) -> float:
    """(a) pika's asynchronous API, confirm mode, up to WINDOW confirms outstanding."""

    async def run() -> float:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        opened: asyncio.Future[object] = loop.create_future()
        state = {"sent": 0, "confirmed": 0}
        props = pika.BasicProperties(delivery_mode=2, content_type="application/octet-stream")
        channel: list[object] = []

        def pump() -> None:
            ch = channel[0]
            while state["sent"] < count and state["sent"] - state["confirmed"] < WINDOW:
                state["sent"] += 1
                ch.basic_publish("", queue, BODY, props)  # type: ignore[attr-defined]

        def on_confirm(frame: object) -> None:
            method = frame.method  # type: ignore[attr-defined]
            if method.multiple:
                state["confirmed"] = method.delivery_tag
            else:
                state["confirmed"] += 1
            if state["confirmed"] >= count and not done.done():
                done.set_result(None)
            pump()

        def on_channel(ch: object) -> None:
            channel.append(ch)
            ch.confirm_delivery(on_confirm, callback=lambda _f: opened.set_result(ch))  # type: ignore[attr-defined]

        conn = AsyncioConnection(
            pika.URLParameters(url),
            on_open_callback=lambda c: c.channel(on_open_callback=on_channel),
            custom_ioloop=loop,
        )
        await opened
        start = time.perf_counter()
        pump()
        await done
        elapsed = time.perf_counter() - start
        conn.close()
        return count / elapsed

    return asyncio.run(run())


def fill(database_url: str, count: int, routing: tuple[str, str]) -> None:
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.delete(outbox))
    now = datetime.now(UTC)
    chunk = 20_000
    for start in range(0, count, chunk):
        rows = [
            {
                "message_id": f"b-{i}",
                "exchange": routing[0],
                "routing_key": routing[1],
                "payload": BODY,
                "content_type": "application/octet-stream",
                "created_at": now,
                "next_attempt_at": now,
            }
            for i in range(start, min(count, start + chunk))
        ]
        with engine.begin() as conn:
            conn.execute(sa.insert(outbox), rows)
    engine.dispose()


def naive_relay(database_url: str, amqp_url: str, queue: str, count: int) -> float:
    """(b) one row at a time: claim, publish, block until its confirm, mark sent."""
    fill(database_url, count, ("", queue))
    engine = create_engine(database_url)
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    ch = conn.channel()
    ch.confirm_delivery()
    props = pika.BasicProperties(delivery_mode=2)
    start = time.perf_counter()
    while True:
        with engine.begin() as db:
            row = db.execute(
                sa.select(outbox.c.id, outbox.c.payload, outbox.c.message_id)
                .where(outbox.c.status == "pending")
                .order_by(outbox.c.id)
                .limit(1)
                .with_for_update(skip_locked=True)
            ).first()
            if row is None:
                break
            ch.basic_publish("", queue, row.payload, props, mandatory=True)
            db.execute(
                sa.update(outbox)
                .where(outbox.c.id == row.id)
                .values(status="sent", sent_at=datetime.now(UTC))
            )
    elapsed = time.perf_counter() - start
    conn.close()
    engine.dispose()
    return count / elapsed


def drained(engine: sa.Engine) -> bool:
    """No pending row left: a probe of the partial index, cheap enough to poll while
    measuring (a count over the whole table would load the database under test)."""
    with engine.connect() as conn:
        q = sa.select(outbox.c.id).where(outbox.c.status == "pending").limit(1)
        return conn.execute(q).first() is None


def this_relay(
    database_url: str,
    amqp_url: str,
    queue: str,
    count: int,
    *,
    on_sample: Callable[[float], None] | None = None,
    relays: int = 1,
) -> float:
    """(c) ``relay run`` as ``relays`` subprocesses, timed from their start to the last row
    marked sent."""
    fill(database_url, count, ("", queue))
    engine = create_engine(database_url)
    env = relay_env(
        RELAY_DATABASE_URL=database_url,
        RELAY_AMQP_URL=amqp_url,
        RELAY_METRICS_PORT="0",
        RELAY_WINDOW=str(WINDOW),
        RELAY_LOG_LEVEL="warning",
    )
    start = time.perf_counter()
    procs = [RelayProcess({**env, "RELAY_NAME": f"bench-{n}"}).start() for n in range(relays)]
    try:
        while not drained(engine):
            if on_sample is not None:
                on_sample(rss_mb(procs[0].pid))
            if not all(p.running for p in procs):
                raise RuntimeError("a relay exited")
            time.sleep(0.2)
        elapsed = time.perf_counter() - start
    finally:
        for proc in procs:
            proc.stop()
        engine.dispose()
    return count / elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--naive-rows", type=int, default=5_000)
    parser.add_argument(
        "--memory-rows",
        type=int,
        default=0,
        help="also drain a backlog this large and report peak RSS",
    )
    parser.add_argument(
        "--three-relays",
        action="store_true",
        help="also drain --rows with three relays on PostgreSQL",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="relay-bench-") as tmp:
        base = Path(tmp)
        node = RabbitNode(base / "rabbit", name="relay-bench")
        pg = PostgresServer(base / "pg")
        node.start()
        pg.start()
        try:
            pg.psql("CREATE DATABASE bench")
            pg_url = pg.url("bench")
            sqlite_url = f"sqlite:///{base / 'bench.db'}"
            for url in (pg_url, sqlite_url):
                migrate(url)
            results: dict[str, float] = {}
            declare(node.url, "bench")
            results["bare_publisher"] = bare_publisher(node.url, "bench", args.rows)
            declare(node.url, "bench")
            results["naive_relay_postgresql"] = naive_relay(
                pg_url, node.url, "bench", args.naive_rows
            )
            for name, url in (("postgresql", pg_url), ("sqlite", sqlite_url)):
                declare(node.url, "bench")
                results[f"relay_{name}"] = this_relay(url, node.url, "bench", args.rows)
            if args.three_relays:
                declare(node.url, "bench")
                results["relay_postgresql_3_relays"] = this_relay(
                    pg_url, node.url, "bench", args.rows, relays=3
                )
            peak = 0.0
            if args.memory_rows:
                samples: list[float] = []
                declare(node.url, "bench")
                results["relay_postgresql_backlog"] = this_relay(
                    pg_url, node.url, "bench", args.memory_rows, on_sample=samples.append
                )
                peak = max(samples)
            declare(node.url, "bench")
        finally:
            node.stop()
            pg.stop()
    a, b = results["bare_publisher"], results["naive_relay_postgresql"]
    print(f"\n{'measure':<34} {'rows/s':>10} {'c/a':>6} {'c/b':>7}")
    for name, rate in results.items():
        ratios = f"{rate / a:>6.2f} {rate / b:>7.1f}" if name.startswith("relay_") else ""
        print(f"{name:<34} {rate:>10.0f} {ratios}")
    print(
        f"(rows: {args.rows}; naive rows: {args.naive_rows}; window {WINDOW}; 200-byte "
        "persistent messages into one durable queue)"
    )
    summary: dict[str, object] = {k: round(v, 1) for k, v in results.items()}
    summary.update(
        {f"{k}_over_bare": round(v / a, 3) for k, v in results.items() if k.startswith("relay_")}
    )
    summary.update(
        {f"{k}_over_naive": round(v / b, 1) for k, v in results.items() if k.startswith("relay_")}
    )
    if args.memory_rows:
        print(f"peak RSS draining {args.memory_rows} rows: {peak:.0f} MB")
        summary["memory_rows"] = args.memory_rows
        summary["peak_rss_mb"] = round(peak, 1)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
