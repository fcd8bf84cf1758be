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
dead-letter queues are named after it).

FastStream hands a subscriber's deliveries over concurrently; the middleware takes them one
at a time, in the order they came, each from its processing to its answer (as the blocking
and aio-pika inboxes do), so that a run's mark is only ever set for the one run under way. It
answers the broker itself (on
FastStream's channel, which has publisher confirms), after FastStream has published the
handler's return value (to its ``@publisher`` targets, or as an RPC reply): that is, after
the commit and before the ack. A delivery whose handler did not run to its commit (a
duplicate, a failure, the database away) publishes nothing. FastStream's own ack of a
message already answered does nothing. While the database is away, the deliveries in hand
wait, unanswered (a requeue would come straight back to the subscriber and spend a quorum
queue's delivery limit), and are processed when it answers; a copy the broker refuses (a
retry's, a dead letter's) sends its delivery back to the queue, uncounted, and the
deliveries wait with back-off. The event loop services the connection meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from types import TracebackType
from typing import Any

from aio_pika.abc import AbstractIncomingMessage
from faststream import BaseMiddleware
from faststream.exceptions import AckMessage
from faststream.message import StreamMessage

from relay.broker.aio_consumer import LOST, answer, delivery_of, tolerate_bytes_in_short_strings
from relay.broker.copies import Refusals
from relay.db.inbox_async import AsyncTransaction
from relay.inbox.aio import AsyncInbox
from relay.inbox.policy import dead_letter_queue
from relay.records import Answer, Delivery, Verdict

__all__ = ["TRANSACTION", "inbox_lifespan", "inbox_middleware"]

log = logging.getLogger(__name__)

# The name of the inbox's transaction in FastStream's context: ``Context(TRANSACTION)``.
TRANSACTION = "inbox_transaction"


class _Unpublished(Exception):
    """Raised out of the consume scope of a delivery whose handler did not run to its commit,
    so that FastStream publishes no return value for it; the middleware's exit answers the
    broker and swallows it."""


def inbox_middleware(inbox: AsyncInbox) -> Callable[..., BaseMiddleware]:
    """A middleware for the router of ``inbox``'s queue (``RabbitRouter(middlewares=[...])``)."""
    queue = inbox.inbox.inbox_queue
    dead = dead_letter_queue(queue)
    gate = _Gate(inbox)
    one_at_a_time = asyncio.Lock()  # first come, first served: in the order they came
    tolerate_bytes_in_short_strings()

    class InboxMiddleware(BaseMiddleware):
        verdict: Answer | None = None
        raw: AbstractIncomingMessage | None = None
        holding = False  # ``one_at_a_time``, from the processing to the answer

        async def consume_scope(self, call_next: Any, msg: StreamMessage[Any]) -> Any:
            self.raw = msg.raw_message
            delivery = delivery_of(self.raw)
            results: list[Any] = []

            async def handler(_delivery: Delivery, tx: AsyncTransaction) -> None:
                # FastStream's way to finish early (``raise AckMessage()``): done, no result.
                with self.context.scope(TRANSACTION, tx), contextlib.suppress(AckMessage):
                    results.append(await call_next(msg))

            await one_at_a_time.acquire()
            self.holding = True
            while True:
                await gate.passable()
                verdict = await _finished(inbox.process(handler, delivery))
                if not verdict.pause:
                    break
                gate.close_until_database_answers()  # this delivery, uncounted, waits
            self.verdict = verdict
            if verdict.verdict is Verdict.ACK and results:  # run, and committed
                return results[-1]
            raise _Unpublished

        async def after_processed(
            self,
            exc_type: type[BaseException] | None = None,
            exc_val: BaseException | None = None,
            exc_tb: TracebackType | None = None,
        ) -> bool | None:
            try:
                return await self._answer(exc_val)
            finally:
                if self.holding:
                    one_at_a_time.release()
                if self.verdict is not None and self.verdict.interrupted is not None:
                    raise self.verdict.interrupted  # cut the handler off: goes on, answered

        async def _answer(self, exc_val: BaseException | None) -> bool | None:
            raw = self.raw
            if self.verdict is None or raw is None:  # the scope did not end: not answered
                return None
            if exc_val is not None and not isinstance(exc_val, _Unpublished):
                log.error(
                    "message %s processed, but its handler's return value was not published: %s",
                    raw.message_id,
                    type(exc_val).__name__,
                    extra={"action": "inbox_result_unpublished", "message_id": raw.message_id},
                )
            try:
                await answer(raw, self.verdict, queue, dead, gate.refusals)
            except LOST as exc:  # the channel is gone, and the delivery goes back with it
                log.warning(
                    "message %s not answered: %s",
                    raw.message_id,
                    type(exc).__name__,
                    extra={"action": "inbox_answer_lost", "message_id": raw.message_id},
                )
                return True
            except Exception as exc:  # a copy refused, or an answer that failed otherwise
                if raw.processed:  # answered by its handler: nothing goes back to the queue
                    log.error(
                        "message %s lost: its handler acked it, and the broker refused every "
                        "copy of it (%s)",
                        raw.message_id,
                        type(exc).__name__,
                        extra={"action": "inbox_copy_lost", "message_id": raw.message_id},
                    )
                else:
                    with contextlib.suppress(*LOST):
                        await raw.reject(requeue=True)
                gate.close_for(gate.refusals.refused(queue, exc))
                return True
            return True  # answered here: nothing for FastStream to ack, reject or log

    return InboxMiddleware


async def _finished(processing: Coroutine[Any, Any, Answer]) -> Answer:
    """A delivery's processing, finished even when FastStream cancels its task (it does when
    the delivery's channel closes, or the app stops): its transaction committed or rolled
    back and its run's mark ended before the next delivery is taken, not cut off halfway (a
    run cut off with its mark set was charged as a crash at its next delivery). The
    cancellation goes on from there; the delivery, unanswered, comes again."""
    task = asyncio.ensure_future(processing)
    cancelled = False
    while True:
        try:
            verdict = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
            continue
        if cancelled:
            raise asyncio.CancelledError
        return verdict


class _Gate:
    """Where a FastStream subscriber's deliveries wait while the inbox cannot take them (the
    database away, copies refused): each one in hand waits here, unanswered (no requeue
    spends a quorum queue's delivery limit), until the gate opens again."""

    def __init__(self, inbox: AsyncInbox) -> None:
        self._inbox = inbox
        self._open = asyncio.Event()
        self._open.set()
        self._reopening: asyncio.Task[None] | None = None
        self.refusals = Refusals(inbox.backoff, inbox.metrics.copies_refused.inc)

    async def passable(self) -> None:
        await self._open.wait()

    def close_until_database_answers(self) -> None:
        """Closed until one look, with back-off, finds the database again."""
        self._close(self._inbox.until_database_answers)

    def close_for(self, seconds: float) -> None:
        async def wait() -> None:
            await asyncio.sleep(seconds)

        self._close(wait)

    def _close(self, until: Callable[[], Coroutine[Any, Any, None]]) -> None:
        if not self._open.is_set():
            return

        async def reopen() -> None:
            await until()
            self._open.set()

        self._open.clear()
        self._reopening = asyncio.create_task(reopen())


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
