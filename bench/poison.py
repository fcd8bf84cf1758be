"""Benchmark: what one bad row costs, for each shape of row that once crashed, spun or stalled
the relay.

    .venv/bin/python -m bench.poison [--backlog 30000] [--window 1000]

Starts a private RabbitMQ node and PostgreSQL. For each case, a `relay run`
(RELAY_MAX_ATTEMPTS=3, default back-off: 1 s, then 2 s between attempts) drains a backlog of
good rows; once it is under way, the bad row is inserted by plain SQL (on PostgreSQL, or on
SQLite where the case is SQLite's), due before the backlog. Reports the seconds from the bad
row's commit until it is parked (or sent, for rows that are good after all), the duplicate
deliveries of good rows, and the good rows' rate in that time (while good rows were still
due), beside a baseline drain with no bad row. Case 6 (a malformed setting) reports the exit
code and the seconds to it. By hand only: the machine is shared.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pika
import sqlalchemy as sa

from devtools.broker import simple_topology, write_topology
from devtools.outbox import empty, fates, insert, statuses
from devtools.relayproc import RelayProcess, relay, relay_env
from devtools.servers import PostgresServer, RabbitNode, wait_until
from relay.db.migrate import migrate
from relay.records import SENT

EXCHANGE, QUEUE = "poison", "poison.all"
DEEP = '{"a": ' * 600 + "1" + "}" * 600
CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "1 routing key of 300 bytes": ("postgresql", {"routing_key": "k" * 300}),
    "2 headers nested 600 deep": ("postgresql", {"headers": DEEP}),
    "3 internal exchange (403 close)": ("postgresql", {"exchange": "amq.rabbitmq.trace"}),
    "4 doubles in headers (sent)": ("postgresql", {"headers": '{"r": 0.30000000000000004}'}),
    "5 SQLite INTEGER payload": ("sqlite", {"payload": 42}),
    "5 SQLite epoch created_at (sent)": ("sqlite", {"created_at": 1767225600}),
}


class Consumer(threading.Thread):
    """Counts deliveries by message id until stopped."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.counts: collections.Counter[str] = collections.Counter()
        self.stopped = threading.Event()

    def run(self) -> None:
        conn = pika.BlockingConnection(pika.URLParameters(self.url))
        channel = conn.channel()
        channel.basic_qos(prefetch_count=1000)
        for method, props, _ in channel.consume(QUEUE, auto_ack=True, inactivity_timeout=0.2):
            if self.stopped.is_set():
                break
            if method is not None:
                self.counts[props.message_id] += 1
        conn.close()


def reset(url: str, amqp_url: str, backlog: int) -> None:
    """An empty queue, and an outbox of ``backlog`` due good rows."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = conn.channel()
    channel.queue_declare(QUEUE, durable=True)
    channel.queue_purge(QUEUE)
    conn.close()
    engine = sa.create_engine(url)
    empty(engine)  # the same message ids are written in every case
    insert(
        engine,
        [
            {"message_id": f"good-{i}", "exchange": EXCHANGE, "routing_key": "k", "payload": b"x"}
            for i in range(backlog)
        ],
    )
    engine.dispose()


def status(engine: sa.Engine, message_id: str) -> str | None:
    return fates(engine, [message_id]).get(message_id)


def sent(engine: sa.Engine) -> int:
    return statuses(engine).get(SENT, 0)


def run_case(
    url: str,
    amqp_url: str,
    env: dict[str, str],
    backlog: int,
    *,
    bad: dict[str, Any] | None,
    log: Path,
) -> dict[str, Any]:
    reset(url, amqp_url, backlog)
    engine = sa.create_engine(url)
    consumer = Consumer(amqp_url)
    consumer.start()
    with RelayProcess({**env, "RELAY_DATABASE_URL": url}, log) as proc:
        wait_until(lambda: sent(engine) > 0, 60, "the relay under way")
        inserted = time.monotonic()
        samples = [(inserted, sent(engine))]
        result: dict[str, Any] = {}
        if bad is not None:
            values = {
                "message_id": "bad",
                "exchange": EXCHANGE,
                "routing_key": "k",
                "payload": b"x",
                # Due before the backlog, so it is claimed next: the time to park is the
                # row's own (its later attempts wait their turn behind older due rows).
                "next_attempt_at": "2000-01-01 00:00:00",
            } | bad
            insert(engine, [values])
        deadline = inserted + (120 if bad is not None else 3)
        while time.monotonic() < deadline:
            samples.append((time.monotonic(), sent(engine)))
            if bad is not None and status(engine, "bad") in ("parked", "sent"):
                result["settled"] = status(engine, "bad")
                break
            time.sleep(0.05)
        result["seconds"] = round(time.monotonic() - inserted, 2)
        # The good rows' rate beside the bad row, counted only while good rows were still
        # due (a backlog that runs out would dilute it).
        flowing = [(t, n) for t, n in samples if n < backlog] or samples[:1]
        (t0, n0), (t1, n1) = samples[0], flowing[-1]
        result["good_rows_per_s"] = round((n1 - n0) / (t1 - t0)) if t1 > t0 else None
        wait_until(lambda: sent(engine) >= backlog, 300, "the backlog sent")
        if bad is not None:
            with engine.connect() as conn:
                row = conn.execute(
                    sa.text("SELECT attempts, last_error FROM outbox WHERE message_id = 'bad'")
                ).one()
            result["attempts"], result["last_error"] = row[0], (row[1] or "")[:90]
        time.sleep(1)
        result["exit"] = proc.stop()
    consumer.stopped.set()
    consumer.join(10)
    result["duplicates"] = sum(n - 1 for m, n in consumer.counts.items() if m.startswith("good-"))
    engine.dispose()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backlog", type=int, default=30_000)
    parser.add_argument("--window", type=int, default=1000)
    args = parser.parse_args()
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="relay-poison-") as tmp:
        base = Path(tmp)
        node, pg = RabbitNode(base / "rabbit", name="relay-poison"), PostgresServer(base / "pg")
        node.start()
        pg.start()
        try:
            pg.psql("CREATE DATABASE bench")
            urls = {"postgresql": pg.url("bench"), "sqlite": f"sqlite:///{base / 'bench.db'}"}
            for url in urls.values():
                migrate(url)
            topology = write_topology(base / "topology.toml", simple_topology(EXCHANGE, QUEUE))
            env = relay_env(
                RELAY_AMQP_URL=node.url,
                RELAY_TOPOLOGY_FILE=str(topology),
                RELAY_METRICS_PORT="0",
                RELAY_MAX_ATTEMPTS="3",
                RELAY_WINDOW=str(args.window),
                RELAY_LOG_LEVEL="warning",
            )
            for database, url in urls.items():
                report[f"baseline {database}"] = run_case(
                    url, node.url, env, args.backlog, bad=None, log=base / f"b-{database}.log"
                )
            for name, (database, bad) in CASES.items():
                report[name] = run_case(
                    urls[database], node.url, env, args.backlog, bad=bad, log=base / "relay.log"
                )
            started = time.monotonic()
            bad_url = relay(
                "run", env=relay_env(RELAY_DATABASE_URL="postgresql://a:b@h:notaport/x")
            )
            report["6 bad database URL"] = {
                "exit": bad_url.returncode,
                "seconds": round(time.monotonic() - started, 2),
                "stderr": bad_url.stderr.strip(),
            }
        finally:
            node.stop()
            pg.stop()
    print(f"\n{'case':<36} {'settled':>8} {'s':>6} {'att':>4} {'dups':>5} {'good/s':>7}")
    for name, r in report.items():
        print(
            f"{name:<36} {r.get('settled', ''):>8} {r['seconds']:>6} {r.get('attempts', ''):>4} "
            f"{r.get('duplicates', ''):>5} {r.get('good_rows_per_s', ''):>7}"
        )
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
