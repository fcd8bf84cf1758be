"""The inbox: effectively-once processing for a RabbitMQ consumer.

The relay delivers at least once: a message can come twice (a relay killed between the
broker's ack and its settle, a replay). The inbox makes processing once per message and
consumer: each delivery's id (its message id, or its CloudEvents ``ce-id``) is inserted
first in the transaction the handler writes in, so that the id and the handler's writes
commit together or not at all; a delivery whose id is there is acked without running the
handler. A handler that raises rolls back, its attempt is counted in a short transaction of
its own, and the delivery is requeued, or after ``RELAY_INBOX_MAX_ATTEMPTS`` rejected
without requeue, to the queue's dead-letter exchange.

    def handle(delivery: Delivery, tx: Transaction) -> None:
        tx.execute(insert_order, {...})   # commits with the message's id

    Inbox(Settings.load(os.environ), InboxSettings.load(os.environ)).run(handle, stop)
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from prometheus_client import CollectorRegistry

from relay.backoff import Backoff
from relay.broker.consumer import Consumer
from relay.constants import INBOX_PURGE_CHUNK, INBOX_TICK_S
from relay.db.inbox import InboxStore, Transaction, TransactionEnded
from relay.errors import StoreError
from relay.inbox.policy import (
    RetrySchedule,
    dead_letter_headers,
    dead_letter_queue,
    key_problem,
    too_many_before,
    window_problem,
)
from relay.metrics import InboxMetrics
from relay.records import Answer, Delivery, Verdict
from relay.settings import InboxSettings, Settings

__all__ = ["Delivery", "Handler", "Inbox", "InboxSettings", "Settings", "Transaction"]

log = logging.getLogger(__name__)

# A message's processing: its writes go through ``tx``, the transaction that holds its id.
Handler = Callable[[Delivery, Transaction], None]


class _HandlerFailed(Exception):
    """The handler raised (its exception the cause): out of the inbox's transaction, which
    rolls back."""


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
        self._schedule = RetrySchedule.of(inbox)
        self._next_purge = 0.0

    def run(self, handler: Handler, stop: threading.Event) -> None:
        """Consume until ``stop`` is set (a signal handler's, another thread's); returns after
        the delivery under way is answered. Deliveries not answered yet go back to the queue."""
        problem = window_problem(self.inbox.inbox_dedupe_window, self.settings.retention)
        if problem is not None:
            log.warning("%s", problem, extra={"action": "inbox_window_short"})
        with contextlib.suppress(StoreError):  # a database away now is the consumer's to wait out
            durability = self.store.durability_problem()
            if durability is not None:
                log.warning("%s", durability, extra={"action": "inbox_not_durable"})
        consumer = Consumer(
            self.settings.amqp_urls,
            self.settings.name,
            self.settings.amqp_tls,
            queue=self.inbox.inbox_queue,
            prefetch=self.inbox.inbox_prefetch,
            handle=lambda delivery: self.process(handler, delivery),
            idle=lambda: self._purge_when_due(stop),
            ready=self._database_answers,
            dead_letters=dead_letter_queue(self.inbox.inbox_queue),
            tick=INBOX_TICK_S,
            backoff=self._backoff,
        )
        try:
            consumer.run(stop)
        finally:
            self.store.close()

    def process(self, handler: Handler, delivery: Delivery) -> Answer:
        """One delivery through the inbox: the verdict the broker is answered with. Only a
        handler that raised (or ended the inbox's transaction), or a run that died inside
        the handler, is charged an attempt: never a database error, a lock wait, or a
        delivery that came again without having reached its handler."""
        problem = key_problem(delivery)
        if problem is not None:
            log.error(
                "dead-lettered a delivery from %r: %s",
                delivery.exchange,
                problem,
                extra={"action": "inbox_unkeyed"},
            )
            self.metrics.dead_lettered.inc()
            return Answer(Verdict.DEAD_LETTER, reason=self._why(problem, 0))
        key = delivery.key
        assert key is not None  # key_problem says so
        marked = False
        try:
            # A delivery that comes again may follow a run that died inside its handler: its
            # run is marked, outside the transaction (SQLite has one writer, and the
            # transaction holds it), and the mark of a run that died is counted.
            if delivery.redelivered:
                counted = self.store.start_run(key)
                marked = True
                if too_many_before(counted, self.inbox.inbox_max_attempts):
                    return self._dead_letter(key, "its earlier runs died inside the handler")
            with self.store.receive(key) as tx:
                if tx is None:
                    self.metrics.duplicates.inc()
                    return Answer(Verdict.ACK)
                started = time.perf_counter()
                try:
                    handler(delivery, tx)
                except Exception as exc:
                    raise _HandlerFailed from exc  # rolls the transaction back
        except _HandlerFailed as failed:
            assert isinstance(failed.__cause__, Exception)
            return self._failed(key, failed.__cause__)
        except TransactionEnded as exc:  # past ``Transaction``: its key may have committed
            with contextlib.suppress(StoreError):
                self.store.forget(key)
            return self._failed(key, exc)
        except StoreError as exc:
            if marked:
                with contextlib.suppress(StoreError):
                    self.store.end_run(key)
            return self._store_failed(key, exc)
        self.metrics.handler_seconds.observe(time.perf_counter() - started)
        self.metrics.processed.inc()
        return Answer(Verdict.ACK)

    def _failed(self, key: str, exc: Exception) -> Answer:
        error = f"{type(exc).__name__}: {exc}"
        try:
            attempts = self.store.count_attempt(key, error)
        except StoreError as failed:  # uncounted: as a database failure
            return self._store_failed(key, failed)
        answer = self._schedule.after(attempts)
        if answer.verdict is Verdict.DEAD_LETTER:
            return self._dead_letter(key, error)
        log.warning(
            "message %s failed (attempt %d of %d), %s: %s",
            key,
            attempts,
            self.inbox.inbox_max_attempts,
            f"again in {answer.delay:g} s" if answer.delay else "requeued",
            error,
            extra={"action": "inbox_retry", "message_id": key, "delay_s": answer.delay},
        )
        self.metrics.retried.inc()
        return answer

    def _dead_letter(self, key: str, why: str) -> Answer:
        log.error(
            "message %s dead-lettered after %d attempts: %s",
            key,
            self.inbox.inbox_max_attempts,
            why,
            extra={"action": "inbox_dead_letter", "message_id": key},
        )
        self.metrics.dead_lettered.inc()
        try:
            failures = self.store.failures(key)
        except StoreError:  # the reason without its counts, rather than no dead letter
            failures = None
        if failures is None:
            return Answer(Verdict.DEAD_LETTER, reason=self._why(why, 0))
        reason = self._why(
            failures.last_error or why,
            failures.attempts,
            first=failures.first_failed_at,
            last=failures.last_failed_at,
        )
        return Answer(Verdict.DEAD_LETTER, reason=reason)

    def _why(
        self,
        error: str,
        attempts: int,
        *,
        first: datetime | None = None,
        last: datetime | None = None,
    ) -> dict[str, object]:
        return dead_letter_headers(
            self.inbox.inbox_consumer,
            self.inbox.inbox_queue,
            error,
            attempts,
            first_failure=first,
            last_failure=last,
        )

    def _store_failed(self, key: str, exc: StoreError) -> Answer:
        """The inbox's own statements failed (the database is away): the delivery goes back
        uncounted, and the consumer stops consuming until the database answers (each
        delivery would fail the same way, and a requeue loop would spend a quorum queue's
        delivery limit)."""
        log.warning(
            "message %s requeued unhandled, consuming paused until the database answers: %s",
            key,
            exc,
            extra={"action": "inbox_database_retry", "message_id": key},
        )
        self.metrics.database_errors.inc()
        return Answer(Verdict.RETRY, pause=True)

    def _database_answers(self) -> bool:
        try:
            self.store.ping()
        except StoreError as exc:
            log.info("database still away: %s", exc, extra={"action": "inbox_database_waiting"})
            return False
        log.info("database answers: consuming again", extra={"action": "inbox_resumed"})
        return True

    def _purge_when_due(self, stop: threading.Event) -> None:
        window = self.inbox.inbox_dedupe_window
        if window == 0 or time.monotonic() < self._next_purge:
            return
        self._next_purge = time.monotonic() + self.inbox.inbox_purge_interval
        try:
            deleted = self.store.purge(window, INBOX_PURGE_CHUNK, stop)
        except StoreError as exc:
            log.warning("inbox purge failed: %s", exc, extra={"action": "inbox_purge_failed"})
            return
        if deleted:
            log.info(
                "purged %d expired ids", deleted, extra={"action": "inbox_purged", "rows": deleted}
            )
