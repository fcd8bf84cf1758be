"""outbox-relay demo: an embedded SQLite outbox relayed to RabbitMQ, consumed back, printed.

Steps, each done the way an operator would:
1. RabbitMQ: use the one on localhost:5672 if it answers, else start a private node.
2. ``relay migrate`` creates the outbox in .demo/outbox.db.
3. A Spark job (examples/order_events_job.py) writes order events with format("outbox").
4. ``relay run`` publishes them with confirms and marks each row sent after its basic.ack.
5. An inbox consumer (examples/inbox_consumer.py) processes the queue into order totals; the
   rows and the messages are printed side by side.
6. Every message is delivered again, as after a relay killed before its settle: the inbox
   acks each copy without processing it, and the totals stay as they were.

Run it with ``scripts/demo`` (or ``.venv/bin/python -m examples.demo [ORDERS]``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pika
import sqlalchemy as sa

from devtools.broker import simple_topology, write_topology
from devtools.outbox import fates, statuses
from devtools.relayproc import RelayProcess, relay, relay_env
from devtools.servers import RabbitNode, free_port, port_open, wait_until
from examples import inbox_consumer
from relay.db.engine import create_engine
from relay.inbox import Delivery, Inbox, InboxSettings, Settings, Transaction
from relay.records import SENT
from relay.spark import LOCAL_MODE_ENV

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".demo"
EXCHANGE, QUEUE = "orders", "orders.audit"


def run(*args: str, env: dict[str, str]) -> str:
    """A `relay` command that must succeed; its output."""
    result = relay(*args, env=env)
    if result.returncode != 0:
        sys.exit(f"relay {args[0]} failed:\n{result.stderr}")
    return result.stdout


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    shutil.rmtree(WORK, ignore_errors=True)
    WORK.mkdir()
    node = None
    if port_open("127.0.0.1", 5672):
        amqp_url = "amqp://guest:guest@127.0.0.1:5672/%2F"
        print("==> using the RabbitMQ on localhost:5672")
    else:
        print("==> starting a private RabbitMQ node (10-30 s) in .demo/rabbit")
        node = RabbitNode(WORK / "rabbit", name="relay-demo")
        node.start()
        amqp_url = node.url
    try:
        return run_demo(amqp_url, count)
    finally:
        if node is not None:
            print("==> stopping the private RabbitMQ node")
            node.stop()


def run_demo(amqp_url: str, count: int, work: Path = WORK) -> int:
    """The demo's steps 2-5 in ``work``, against the broker at ``amqp_url``; 0 when every
    message was sent and consumed."""
    database_url = f"sqlite:///{work / 'outbox.db'}"
    topology = simple_topology(EXCHANGE, QUEUE, routing_key="order.#")
    port = free_port()
    env = relay_env(
        RELAY_DATABASE_URL=database_url,
        RELAY_AMQP_URL=amqp_url,
        RELAY_TOPOLOGY_FILE=str(write_topology(work / "topology.toml", topology)),
        RELAY_METRICS_PORT=str(port),
        RELAY_METRICS_HOST="127.0.0.1",
        RELAY_POLL_INTERVAL="0.1",
        RELAY_ORDERING="true",
    )
    for name, value in LOCAL_MODE_ENV.items():  # the Spark job runs in local mode
        env.setdefault(name, value)

    print("==> relay migrate")
    run("migrate", env=env)
    print(f"==> Spark job: order events for {count} orders into the outbox (local Spark)")
    job = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "order_events_job.py"),
            "--database-url",
            database_url,
            "--orders",
            str(count),
            "--exchange",
            EXCHANGE,
        ],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if job.returncode != 0:
        sys.exit(f"the Spark job failed:\n{job.stderr[-3000:]}")
    print("    " + job.stdout.strip().splitlines()[-1])

    print("==> relay run (until every row is marked sent)")

    def unsent() -> int:
        return sum(n for status, n in statuses(database_url).items() if status != SENT)

    with RelayProcess(env, work / "relay.log") as proc:
        wait_until(lambda: unsent() == 0 or not proc.running, 120, "rows to be sent")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        code = proc.stop()
    if code != 0 or unsent():
        print(proc.log(), file=sys.stderr)
        sys.exit(f"relay run exited with {code}; {unsent()} rows not sent")

    # Acked rows are deleted (RELAY_KEEP_SENT=ids): their message ids are in the sent log.
    sent = statuses(database_url).get(SENT, 0)
    print("==> an inbox consumer processes them into order totals (examples/inbox_consumer.py)")
    with InboxConsumer(database_url, amqp_url) as consumer:
        consumer.wait("inbox_processed_total", sent)
        delivered = list(consumer.seen)
        print("==> every message delivered again: the inbox acks each copy unprocessed")
        again(amqp_url, delivered)
        consumer.wait("inbox_duplicates_total", sent)
    messages = [(d.key or "", d.routing_key, d.body) for d in delivered]
    fate = fates(database_url, [m[0] for m in messages])
    print(f"\n==> processed {len(messages)} messages from queue {QUEUE!r}:\n")
    print(f"{'message_id':<15} {'routing key':<15} {'in the outbox':<14} body")
    for message_id, routing_key, body in sorted(messages, key=lambda m: m[2]):
        status = fate.get(message_id, "NOT FOUND")
        print(f"{message_id[:12] + '...':<15} {routing_key:<15} {status:<14} {body.decode()}")
    wanted = [
        "relay_published_total",
        'relay_outcomes_total{outcome="acked"}',
        "relay_confirm_latency_seconds_count",
    ]
    print("\n==> from the relay's /metrics:")
    for line in metrics.splitlines():
        if line.split(" ")[0] in wanted:
            print("   ", line)
    print("\n==> order totals, each event counted once though delivered twice:\n")
    totals = order_totals(database_url)
    for order_id, events, paid_cents in totals:
        print(f"    order {order_id}: {events} events, paid {paid_cents / 100:.2f}")
    consumed = {m[0] for m in messages}
    if len(consumed) != sent or any(fate.get(m) != SENT for m in consumed):
        print(f"\n{sent} messages sent, {len(consumed)} consumed: they differ", file=sys.stderr)
        return 1
    if sum(events for _order, events, _paid in totals) != sent:
        print(f"\nthe totals count other than {sent} events", file=sys.stderr)
        return 1
    print(f"\nAll {sent} messages were confirmed by the broker, marked sent, and consumed once.")
    return 0


class InboxConsumer:
    """``examples.inbox_consumer.handle`` through the inbox, on a thread of its own, keeping
    what it processed (``seen``)."""

    def __init__(self, database_url: str, amqp_url: str) -> None:
        engine = create_engine(database_url)
        inbox_consumer.metadata.create_all(engine)
        engine.dispose()
        settings = Settings.load({}, {"database_url": database_url, "amqp_url": amqp_url})
        self.inbox = Inbox(settings, InboxSettings.load({}, {"inbox_queue": QUEUE}))
        self.seen: list[Delivery] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.inbox.run, args=(self.handle, self.stop))

    def handle(self, delivery: Delivery, tx: Transaction) -> None:
        inbox_consumer.handle(delivery, tx)
        self.seen.append(delivery)

    def wait(self, metric: str, count: int) -> None:
        labels = {"consumer": QUEUE}
        registry = self.inbox.metrics.registry
        wait_until(lambda: registry.get_sample_value(metric, labels) == count, 60, metric)

    def __enter__(self) -> InboxConsumer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(30)


def again(amqp_url: str, deliveries: list[Delivery]) -> None:
    """Each delivery published again as it came (its message id, body and routing key)."""
    conn = pika.BlockingConnection(pika.URLParameters(amqp_url))
    channel = conn.channel()
    channel.confirm_delivery()
    for d in deliveries:
        properties = pika.BasicProperties(
            message_id=d.message_id, content_type=d.content_type, headers=d.headers
        )
        channel.basic_publish(d.exchange, d.routing_key, d.body, properties)
    conn.close()


def order_totals(database_url: str) -> list[tuple[int, int, int]]:
    engine = create_engine(database_url)
    try:
        with engine.connect() as conn:
            table = inbox_consumer.order_totals
            rows = conn.execute(sa.select(table).order_by(table.c.order_id))
            return [(r.order_id, r.events, r.paid_cents) for r in rows]
    finally:
        engine.dispose()


if __name__ == "__main__":
    sys.exit(main())
