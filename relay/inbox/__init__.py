"""The inbox: effectively-once processing for a RabbitMQ consumer.

The relay delivers at least once: a message can come twice (a relay killed between the
broker's ack and its settle, a replay). The inbox makes processing once per message and
consumer: each delivery's id (its message id, or its CloudEvents ``ce-id``) is inserted
first in the transaction the handler writes in, so that the id and the handler's writes
commit together or not at all; a delivery whose id is there is acked without running the
handler. A handler that raises rolls back, its attempt is counted in a short transaction of
its own, and the message is tried again on the retry schedule (at once, then after delays
the broker holds), or after ``RELAY_INBOX_MAX_ATTEMPTS`` failures published to the queue's
dead letters with the reason (``relay.inbox.policy``). The decisions are
``relay.inbox.flow``'s; ``relay.inbox.aio`` is the same inbox for asyncio.

    def handle(delivery: Delivery, tx: Transaction) -> None:
        tx.execute(insert_order, {...})   # commits with the message's id

    Inbox(Settings.load(os.environ), InboxSettings.load(os.environ)).run(handle, stop)
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry

from relay.backoff import Backoff
from relay.broker.consumer import Consumer
from relay.constants import INBOX_TICK_S
from relay.db.inbox import InboxStore
from relay.db.inbox_transaction import Transaction
from relay.inbox.flow import Flow
from relay.inbox.policy import dead_letter_queue
from relay.inbox.purge import purge_slice
from relay.inbox.steps import drive
from relay.metrics import InboxMetrics
from relay.records import Answer, Delivery
from relay.settings import InboxSettings, Settings

__all__ = ["Delivery", "Handler", "Inbox", "InboxSettings", "Settings", "Transaction"]

log = logging.getLogger(__name__)

# A message's processing: its writes go through ``tx``, the transaction that holds its id.
Handler = Callable[[Delivery, Transaction], None]


class Inbox:
    """A consumer of one queue that processes each message once under its name."""

    def __init__(
        self,
        settings: Settings,
        inbox: InboxSettings,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.inbox = inbox
        self.store = InboxStore(settings.database_url, inbox.inbox_consumer)
        self.metrics = InboxMetrics(inbox.inbox_consumer, registry)
        self._backoff = Backoff(settings.backoff_initial, settings.reconnect_max)
        self.flow = Flow(inbox, self.store.statements, self.metrics)
        self._next_purge = 0.0

    def run(self, handler: Handler, stop: threading.Event) -> None:
        """Consume until ``stop`` is set (a signal handler's, another thread's); returns after
        the delivery under way is answered. Deliveries not answered yet go back to the queue."""
        drive(self.flow.starting(self.settings.retention), self.store)
        consumer = Consumer(
            self.settings.amqp_urls,
            self.settings.name,
            self.settings.amqp_tls,
            queue=self.inbox.inbox_queue,
            prefetch=self.inbox.inbox_prefetch,
            handle=lambda delivery: self.process(handler, delivery),
            idle=self._purge_when_due,
            ready=self._database_answers,
            dead_letters=dead_letter_queue(self.inbox.inbox_queue),
            tick=INBOX_TICK_S,
            backoff=self._backoff,
            refused=self.metrics.copies_refused.inc,
        )
        try:
            consumer.run(stop)
        finally:
            self.store.close()

    def process(self, handler: Handler, delivery: Delivery) -> Answer:
        """One delivery through the inbox (``relay.inbox.flow``): the verdict the broker is
        answered with."""
        try:
            with self.store.message(lambda tx: handler(delivery, tx)) as run:
                return drive(self.flow.process(delivery), run)
        except Exception as exc:  # the inbox's own fault: counted, never the consumer's end
            return drive(self.flow.broke(delivery, exc), self.store)

    def _database_answers(self) -> bool:
        return drive(self.flow.database_answers(), self.store)

    def _purge_when_due(self) -> None:
        """A slice of the purge when one is due (``relay.inbox.purge``): the next at the next
        tick while more is left, else after the purge interval."""
        window = self.inbox.inbox_dedupe_window
        if window == 0 or time.monotonic() < self._next_purge:
            return
        if not drive(purge_slice(self.flow), self.store):
            self._next_purge = time.monotonic() + self.inbox.inbox_purge_interval
