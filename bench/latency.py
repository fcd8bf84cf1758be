"""Benchmark: commit-to-confirm latency at a steady write rate, on PostgreSQL or MariaDB.

    .venv/bin/python -m bench.latency [--rate 1000] [--seconds 20] [--batch 10]
                                      [--idle-seconds 20] [--database postgresql|mariadb]

Starts a private RabbitMQ node and PostgreSQL or MariaDB (default durability), runs
``relay run``, and inserts ``--rate`` rows a second for ``--seconds`` in transactions of
``--batch`` rows, as an application would. A row's latency is from its insert
(``created_at``, the transaction's start, just before its commit) to the moment the relay
marked it sent (``sent_at``, after the broker's ack). Measured twice: with the probe of the
newest id (``RELAY_PROBE_INTERVAL`` at its default), and polling only (the probe off,
``RELAY_POLL_INTERVAL`` at its default). Before the writes, the relay idles for
``--idle-seconds``: the database's CPU meanwhile (every server process, from /proc), as a
share of one core, less the same with no relay (its background work), is what an idle
relay's probing costs it. For reference, a bare pika
publisher paced at the same rate into the same queue reports its own publish-to-confirm
latency: the broker's share, which no relay can undercut. Prints p50/p90/p99/max and, last,
one JSON line. By hand only: these machines are shared and noisy.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pika
import sqlalchemy as sa
from pika.adapters.asyncio_connection import AsyncioConnection

from devtools.broker import fresh_queue
from devtools.outbox import empty, sent_latencies, statuses
from devtools.procfs import tree_cpu_seconds
from devtools.relayproc import RelayProcess, relay_env
from devtools.servers import MariaDBServer, PostgresServer, RabbitNode, wait_until
from relay.db.engine import create_engine
from relay.db.migrate import migrate
from relay.db.schema import outbox
from relay.records import SENT

QUEUE = "latency"
BODY = b"x" * 200
TICK_S = 0.01  # the paced publisher sends rate * TICK_S messages every TICK_S seconds


def bare_publisher(amqp_url: str, rate: int, seconds: float) -> dict[str, float]:
    """Publish-to-confirm latency of a bare pika publisher paced at ``rate`` messages/s."""

    async def run() -> list[float]:
        loop = asyncio.get_running_loop()
        opened: asyncio.Future[object] = loop.create_future()
        sent_at: dict[int, float] = {}
        latencies: list[float] = []
        props = pika.BasicProperties(delivery_mode=2, content_type="application/octet-stream")

        def on_confirm(frame: object) -> None:
            method = frame.method  # type: ignore[attr-defined]
            now = time.perf_counter()
            tags = (
                [t for t in sent_at if t <= method.delivery_tag]
                if method.multiple
                else [method.delivery_tag]
            )
            for tag in tags:
                latencies.append(now - sent_at.pop(tag))

        conn = AsyncioConnection(
            pika.URLParameters(amqp_url),
            on_open_callback=lambda c: c.channel(
                on_open_callback=lambda ch: ch.confirm_delivery(
                    on_confirm, callback=lambda _f: opened.set_result(ch)
                )
            ),
            custom_ioloop=loop,
        )
        channel = await opened
        start, tag = time.perf_counter(), 0
        while (now := time.perf_counter()) - start < seconds:
            while tag < (now - start) * rate:
                tag += 1
                sent_at[tag] = time.perf_counter()
                channel.basic_publish("", QUEUE, BODY, props)  # type: ignore[attr-defined]
            await asyncio.sleep(TICK_S)
        while sent_at:
            await asyncio.sleep(TICK_S)
        conn.close()
        return latencies

    ms = sorted(1000 * x for x in asyncio.run(run()))
    p50, p90, p99 = (statistics.quantiles(ms, n=100)[q - 1] for q in (50, 90, 99))
    return {
        "rows_per_s": round(len(ms) / seconds, 1),
        "p50_ms": round(p50, 1),
        "p90_ms": round(p90, 1),
        "p99_ms": round(p99, 1),
        "max_ms": round(ms[-1], 1),
    }


def idle_share(pid: int, seconds: float) -> float:
    """The share of one core the server ``pid`` (with its children) uses over ``seconds``."""
    cpu = tree_cpu_seconds(pid)
    time.sleep(seconds)
    return (tree_cpu_seconds(pid) - cpu) / seconds


def measure(
    url: str, amqp_url: str, args: argparse.Namespace, server_pid: int, **settings: str
) -> dict[str, float]:
    rate, seconds, batch = args.rate, args.seconds, args.batch
    engine = create_engine(url)
    env = relay_env(
        RELAY_DATABASE_URL=url,
        RELAY_AMQP_URL=amqp_url,
        RELAY_METRICS_PORT="0",
        RELAY_LOG_LEVEL="warning",
        **settings,
    )
    proc = RelayProcess(env).start()
    rows = [{"routing_key": QUEUE, "payload": BODY}] * batch
    try:
        time.sleep(3)  # connected and idle
        idle_cpu = idle_share(server_pid, args.idle_seconds)
        start = time.perf_counter()
        total = 0
        while (now := time.perf_counter()) - start < seconds:
            with engine.begin() as conn:
                conn.execute(sa.insert(outbox), rows)
            total += batch
            time.sleep(max(0.0, start + total / rate - time.perf_counter()))
        achieved = total / (now - start)

        wait_until(lambda: statuses(engine).get(SENT) == total, 120, "every row sent")
        latencies = sorted(s * 1000 for s in sent_latencies(engine))
        empty(engine)
    finally:
        proc.stop()
        engine.dispose()
    percentiles = statistics.quantiles(latencies, n=100, method="inclusive")
    p50, p90, p99 = percentiles[49], percentiles[89], percentiles[98]
    return {
        "rows_per_s": round(achieved, 1),
        "p50_ms": round(p50, 1),
        "p90_ms": round(p90, 1),
        "p99_ms": round(p99, 1),
        "max_ms": round(latencies[-1], 1),
        "idle_db_cpu_pct": round(idle_cpu * 100, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--idle-seconds", type=float, default=20.0)
    parser.add_argument("--database", choices=("postgresql", "mariadb"), default="postgresql")
    args = parser.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="relay-latency-") as tmp:
        node = RabbitNode(Path(tmp) / "rabbit", name="relay-latency")
        server: PostgresServer | MariaDBServer
        if args.database == "postgresql":
            server = PostgresServer(Path(tmp) / "pg")
        else:
            server = MariaDBServer(Path(tmp) / "mariadb")
        node.start()
        try:
            server.start()
            server.create_database("bench")
            url = server.url("bench")
            migrate(url)
            fresh_queue(node.url, QUEUE)
            results["bare pika"] = bare_publisher(node.url, args.rate, args.seconds)
            no_relay = idle_share(server.pid(), args.idle_seconds) * 100
            fresh_queue(node.url, QUEUE)
            results["probe"] = measure(url, node.url, args, server.pid())
            fresh_queue(node.url, QUEUE)
            polling = {"RELAY_PROBE_INTERVAL": "0"}
            results["polling"] = measure(url, node.url, args, server.pid(), **polling)
        finally:
            node.stop()
            server.stop()
    print(
        f"\n{'measure':<10} {'rows/s':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8}"
        f" {'idle db %':>9}"
    )
    for name, r in results.items():
        print(
            f"{name:<10} {r['rows_per_s']:>8.0f} {r['p50_ms']:>8.1f} {r['p90_ms']:>8.1f} "
            f"{r['p99_ms']:>8.1f} {r['max_ms']:>8.1f} {r.get('idle_db_cpu_pct', 0):>9.2f}"
        )
    print(f"idle database without a relay: {no_relay:.2f}% of a core")
    print(
        json.dumps(
            {
                "rate": args.rate,
                "seconds": args.seconds,
                "batch": args.batch,
                "idle_db_cpu_pct_no_relay": round(no_relay, 2),
                **results,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
