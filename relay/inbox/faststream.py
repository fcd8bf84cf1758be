"""The inbox as FastStream middleware, for a RabbitMQ subscriber: each message processed once
under the inbox's consumer name, with the semantics of ``relay.inbox.aio`` (the decisions
are ``relay.inbox.flow``'s). The handler receives the inbox's transaction through
FastStream's context, and writes its effects in it:

    inbox = AsyncInbox(Settings.load(os.environ), InboxSettings.load(os.environ))
    router = RabbitRouter(middlewares=[inbox_middleware(inbox)])

    @router.subscriber(RabbitQueue(queue, declare=False))
    async def handle(order: dict, tx: AsyncTransaction = Context(TRANSACTION)) -> None:
        await tx.execute(insert_order, order)   # commits with the message's id

    broker = RabbitBroker(url)
    broker.include_router(router)
    app = FastStream(broker, lifespan=inbox_lifespan(inbox))

FastStream (0.6 on) sets middlewares on a broker or a router: the inbox's go on a router that
holds its queue's subscriber alone. ``RELAY_INBOX_QUEUE`` names that queue (its retry and
dead-letter queues are named after it). The middleware answers the broker itself (on
FastStream's channel, which has publisher confirms): FastStream's own ack of a message
already answered does nothing. While the database is away, the deliveries in hand wait,
unanswered (FastStream hands several over at once), and are processed when it answers: a
requeue would come straight back to the subscriber and spend a quorum queue's delivery
limit. The event loop services the connection meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

from faststream import BaseMiddleware
from faststream.message import StreamMessage

from relay.broker.aio_consumer import answer, delivery_of, tolerate_bytes_in_short_strings
from relay.db.inbox_async import AsyncTransaction
from relay.inbox.aio import AsyncInbox
from relay.inbox.policy import dead_letter_queue
from relay.records import Delivery

__all__ = ["TRANSACTION", "inbox_lifespan", "inbox_middleware"]

# The name of the inbox's transaction in FastStream's context: ``Context(TRANSACTION)``.
TRANSACTION = "inbox_transaction"


def inbox_middleware(inbox: AsyncInbox) -> Callable[..., BaseMiddleware]:
    """A middleware for the router of ``inbox``'s queue (``RabbitRouter(middlewares=[...])``)."""
    queue = inbox.inbox.inbox_queue
    dead = dead_letter_queue(queue)
    gate = _DatabaseGate(inbox)
    tolerate_bytes_in_short_strings()

    class InboxMiddleware(BaseMiddleware):
        async def consume_scope(self, call_next: Any, msg: StreamMessage[Any]) -> Any:
            raw = msg.raw_message
            delivery = delivery_of(raw)

            async def handler(_delivery: Delivery, tx: AsyncTransaction) -> None:
                with self.context.scope(TRANSACTION, tx):
                    await call_next(msg)

            while True:
                await gate.passable()
                verdict = await inbox.process(handler, delivery)
                if not verdict.pause:
                    break
                gate.close()  # and this delivery, uncounted, waits with the others
            await answer(raw, verdict, queue, dead)
            return None

    return InboxMiddleware


class _DatabaseGate:
    """Where a FastStream subscriber's deliveries wait while the database is away: FastStream
    hands messages over concurrently, so each one in hand waits here (unanswered: no
    requeue spends a quorum queue's delivery limit) until one look, with back-off, finds
    the database again."""

    def __init__(self, inbox: AsyncInbox) -> None:
        self._inbox = inbox
        self._open = asyncio.Event()
        self._open.set()
        self._reopening: asyncio.Task[None] | None = None

    async def passable(self) -> None:
        await self._open.wait()

    def close(self) -> None:
        if self._open.is_set():
            self._open.clear()
            self._reopening = asyncio.create_task(self._reopen())

    async def _reopen(self) -> None:
        await self._inbox.until_database_answers()
        self._open.set()


def inbox_lifespan(
    inbox: AsyncInbox,
) -> Callable[..., contextlib.AbstractAsyncContextManager[None]]:
    """A FastStream ``lifespan`` for an app with ``inbox``'s subscribers: its start's warnings,
    its purge beside the app, its engine closed when the app stops."""

    @contextlib.asynccontextmanager
    async def lifespan(*_args: Any, **_kwargs: Any) -> AsyncIterator[None]:
        stop = asyncio.Event()
        async with inbox.serving(stop):
            try:
                yield
            finally:
                stop.set()

    return lifespan
