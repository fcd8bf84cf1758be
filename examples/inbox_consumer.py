"""Example consumer with the inbox: order events (examples/order_events_job.py) into per-order
totals, each event counted once however often it is delivered.

Copy it and replace ``handle`` with your own processing. Run it beside the relay, with the
same RELAY_DATABASE_URL and RELAY_AMQP_URL, and the queue to consume:

    RELAY_INBOX_QUEUE=orders.billing python -m examples.inbox_consumer

``relay migrate`` makes the inbox's tables; this script makes its own (``order_totals``).
The handler's writes go through ``tx``, the transaction that holds the event's message id:
they commit together, so a redelivered event (a relay killed before its settle, a replay) is
acked without being counted again. SIGTERM or Ctrl-C stops it after the event under way.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading

import sqlalchemy as sa
from prometheus_client import start_http_server

from relay.db.engine import create_engine
from relay.inbox import Delivery, Handler, Inbox, InboxSettings, Settings, Transaction
from relay.logs import configure

metadata = sa.MetaData()
order_totals = sa.Table(
    "order_totals",
    metadata,
    # Not AUTO_INCREMENT on MariaDB, where inserting 0 into such a column takes the next value.
    sa.Column("order_id", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("events", sa.Integer(), nullable=False),
    sa.Column("paid_cents", sa.BigInteger(), nullable=False),
)


def handle(delivery: Delivery, tx: Transaction) -> None:
    """One order event: its order's event count and paid amount, in the inbox's transaction."""
    event = json.loads(delivery.body)
    paid = event["amount_cents"] if event["event"] == "paid" else 0
    updated = tx.execute(
        order_totals.update()
        .where(order_totals.c.order_id == event["order_id"])
        .values(events=order_totals.c.events + 1, paid_cents=order_totals.c.paid_cents + paid)
    )
    if updated.rowcount == 0:
        tx.execute(
            order_totals.insert(),
            {"order_id": event["order_id"], "events": 1, "paid_cents": paid},
        )


def main(handler: Handler = handle) -> int:
    """Consume ``RELAY_INBOX_QUEUE`` through the inbox with ``handler`` until SIGTERM/SIGINT;
    /metrics on ``RELAY_METRICS_PORT`` (0: none)."""
    settings = Settings.load(os.environ)
    configure(settings.log_level, settings.log_format)
    engine = create_engine(settings.database_url)
    metadata.create_all(engine)
    engine.dispose()
    inbox = Inbox(settings, InboxSettings.load(os.environ))
    if settings.metrics_port:
        start_http_server(settings.metrics_port, settings.metrics_host, inbox.metrics.registry)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    logging.getLogger(__name__).info("consuming", extra={"action": "example_started"})
    inbox.run(handler, stop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
