"""The inbox for asyncio consumers: ``relay.inbox.Inbox``'s semantics (one run per message and
consumer, retries held by the broker, only real failures counted, a guarded transaction,
dead letters that say why, a pause while the database is away), with an ``async`` handler
that writes through ``AsyncTransaction`` on SQLAlchemy's asyncio engine, and aio-pika's
consumer. The decisions are the blocking inbox's own (``relay.inbox.flow``).

    async def handle(delivery: Delivery, tx: AsyncTransaction) -> None:
        await tx.execute(insert_order, {...})   # commits with the message's id

    await AsyncInbox(Settings.load(os.environ), InboxSettings.load(os.environ)).run(handle, stop)

For FastStream, see ``relay.inbox.faststream``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from prometheus_client import CollectorRegistry

from relay.backoff import Backoff
from relay.broker.aio_consumer import AsyncConsumer, until_ready
from relay.constants import INBOX_TICK_S
from relay.db.inbox_async import AsyncInboxStore, AsyncTransaction
from relay.inbox.flow import Flow
from relay.inbox.policy import dead_letter_queue
from relay.inbox.purge import purge_slice
from relay.inbox.steps import drive_async
from relay.metrics import InboxMetrics
from relay.records import Answer, Delivery
from relay.settings import InboxSettings, Settings

__all__ = ["AsyncHandler", "AsyncInbox", "AsyncTransaction", "Delivery"]

# A message's processing: its writes go through ``tx``, the transaction that holds its id.
AsyncHandler = Callable[[Delivery, AsyncTransaction], Awaitable[None]]


class AsyncInbox:
    """A consumer of one queue that processes each message once under its name, on asyncio."""

    def __init__(
        self,
        settings: Settings,
        inbox: InboxSettings,
        registry: CollectorRegistry | None = None,
    ) -> None:
        self.settings = settings
        self.inbox = inbox
        self.store = AsyncInboxStore(settings.database_url, inbox.inbox_consumer)
        self.metrics = InboxMetrics(inbox.inbox_consumer, registry)
        self.backoff = Backoff(settings.backoff_initial, settings.reconnect_max)
        self.flow = Flow(inbox, self.store.statements, self.metrics)

    async def run(self, handler: AsyncHandler, stop: asyncio.Event) -> None:
        """Consume until ``stop`` is set; returns after the delivery under way is answered.
        Deliveries not answered yet go back to the queue."""
        consumer = AsyncConsumer(
            self.settings.amqp_urls,
            self.settings.name,
            self.settings.amqp_tls,
            queue=self.inbox.inbox_queue,
            prefetch=self.inbox.inbox_prefetch,
            handle=lambda delivery: self.process(handler, delivery),
            ready=self.database_answers,
            dead_letters=dead_letter_queue(self.inbox.inbox_queue),
            tick=INBOX_TICK_S,
            backoff=self.backoff,
            refused=self.metrics.copies_refused.inc,
        )
        async with self.serving(stop):
            await consumer.run(stop)

    @contextlib.asynccontextmanager
    async def serving(self, stop: asyncio.Event) -> AsyncIterator[None]:
        """What a consumer of this inbox runs inside (``run``'s, a FastStream app's): the
        start's warnings (``Flow.starting``), the purge as a task beside it, the engine
        closed at the end."""
        await drive_async(self.flow.starting(self.settings.retention), self.store)
        purging = asyncio.create_task(self.purge(stop))
        try:
            yield
        finally:
            purging.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await purging
            await self.store.close()

    async def until_database_answers(self) -> None:
        """Wait, with back-off, until the database answers (a FastStream consumer's pause:
        it holds no delivery meanwhile)."""
        await until_ready(self.database_answers, self.backoff, asyncio.Event())

    async def process(self, handler: AsyncHandler, delivery: Delivery) -> Answer:
        """One delivery through the inbox (``relay.inbox.flow``): the verdict the broker is
        answered with."""
        try:
            async with self.store.message(lambda tx: handler(delivery, tx)) as run:
                return await drive_async(self.flow.process(delivery), run)
        except Exception as exc:  # the inbox's own fault: counted, never the consumer's end
            return await drive_async(self.flow.broke(delivery, exc), self.store)

    async def database_answers(self) -> bool:
        return await drive_async(self.flow.database_answers(), self.store)

    async def purge(self, stop: asyncio.Event) -> None:
        """The purge, a task beside the consumer: a slice (``relay.inbox.purge``), then the
        next one at once while more is left, else after the purge interval."""
        if self.inbox.inbox_dedupe_window == 0:
            return
        while not stop.is_set():
            more = await drive_async(purge_slice(self.flow), self.store)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0 if more else self.inbox.inbox_purge_interval)
