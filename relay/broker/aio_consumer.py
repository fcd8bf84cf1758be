"""An asyncio consumer of one queue, for the asyncio inbox (``relay.inbox.aio``): aio-pika's
deliveries handed to a coroutine one at a time, each answered as it says (ack, a copy in a
retry queue, a dead letter with its reasons, requeue), through the broker's nodes in turn
with back-off when a connection fails. ``answer`` is also what the FastStream middleware
(``relay.inbox.faststream``) answers with, on FastStream's own channel. aio-pika's errors
end here.

One delivery at a time: the handler's transaction and the ack are in order. The event loop
services the connection (heartbeats) throughout, a pause included.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence

import aio_pika
import aiormq
import aiormq.exceptions
from aio_pika.abc import AbstractIncomingMessage
from pamqp import decode, encode
from pamqp.commands import Basic
from pamqp.header import ContentHeader

from relay.backoff import Backoff
from relay.broker.connection import address, connection_parameters, tls_context
from relay.broker.consumer import log_retry
from relay.broker.copies import (
    CopyRefused,
    Refusals,
    fits_a_frame,
    log_unfitting,
    retried,
    retry_queue,
)
from relay.broker.rotation import Rotation
from relay.records import RETRY_HEADER, Answer, Delivery, Verdict, key_of
from relay.settings import TlsOptions

log = logging.getLogger(__name__)

# An AMQP short string's longest, in bytes (its length is one octet).
SHORT_STRING_MAX_BYTES = 255
# What a broken connection or channel raises under aio-pika, and the socket's own.
LOST = (
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,
    ConnectionError,
    OSError,
    asyncio.TimeoutError,
)


def tolerate_bytes_in_short_strings() -> None:
    """Let this process's aio-pika connections receive short strings (a message id, a type, a
    content type) that are not UTF-8. pamqp (aio-pika's codec) raises on them, and the
    connection closes: the message goes back to the queue, the next consumer's connection
    closes on it too, and the queue is stuck behind one message a C or Go producer wrote.
    From here on such a string arrives as ``Undecodable`` (its bytes kept), is written back as
    those bytes (a dead letter keeps its id), and the inbox dead-letters such an id with its
    reason. A ``str`` and not ``bytes`` (pamqp's long strings fall back to bytes): aio-pika
    makes every property a ``str`` with ``str()``, and a ``bytes`` became its repr, a
    different id. Idempotent."""
    decode.METHODS["shortstr"] = _short_str
    encode.METHODS["shortstr"] = _short_string


class Undecodable(str):
    """A short string that was not UTF-8: its bytes as ``raw``, its text with each byte that
    is not UTF-8 as a lone surrogate (which no UTF-8 encoder writes: only ``_short_string``,
    which writes ``raw``). ``str()`` keeps it whole."""

    __slots__ = ("raw",)
    raw: bytes

    def __new__(cls, raw: bytes) -> Undecodable:
        text = super().__new__(cls, raw.decode("utf-8", "surrogateescape"))
        text.raw = raw
        return text

    def __str__(self) -> str:
        return self


def _short_str(value: bytes) -> tuple[int, str]:
    _, length = decode.octet(value)
    raw = value[1 : length + 1]
    try:
        return length + 1, raw.decode("utf-8")
    except UnicodeDecodeError:
        return length + 1, Undecodable(raw)


def _short_string(value: str) -> bytes:
    raw = value.raw if isinstance(value, Undecodable) else value.encode("utf-8")
    if len(raw) > SHORT_STRING_MAX_BYTES:
        raise TypeError(f"string exceeds maximum length of {SHORT_STRING_MAX_BYTES} bytes")
    return encode.octet(len(raw)) + raw


class AsyncConsumer:
    """``relay.broker.consumer.Consumer`` for asyncio: consumes ``queue`` from the first of
    ``urls`` that answers, handing each delivery to ``handle`` and answering the broker with
    its verdict. An answer that pauses cancels the consumer until ``ready`` says yes (asked
    with back-off). ``run`` returns once ``stop`` is set."""

    def __init__(
        self,
        urls: Sequence[str],
        name: str,
        tls: TlsOptions | None,
        *,
        queue: str,
        prefetch: int,
        handle: Callable[[Delivery], Awaitable[Answer]],
        ready: Callable[[], Awaitable[bool]],
        dead_letters: str,
        tick: float,
        backoff: Backoff,
        refused: Callable[[], None],
    ) -> None:
        self._urls = urls
        self._params = [connection_parameters(url, name, tls) for url in urls]
        self._name = name
        self._tls = tls
        self._queue = queue
        self._prefetch = prefetch
        self._handle = handle
        self._ready = ready
        self._dead_letters = dead_letters
        self._tick = tick
        self._backoff = backoff
        self._refusals = Refusals(backoff, refused)
        tolerate_bytes_in_short_strings()

    async def run(self, stop: asyncio.Event) -> None:
        nodes = Rotation(list(zip(self._urls, self._params, strict=True)), self._backoff)
        while not stop.is_set():
            url, params = nodes.node
            try:
                await self._session(url, stop)
                nodes.worked()
            except LOST as exc:
                delay = nodes.failed()
                reason = f"{type(exc).__name__}: {exc}"
                log_retry(address(params), self._queue, nodes.failures, delay, reason)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)

    async def _session(self, url: str, stop: asyncio.Event) -> None:
        connection = await aio_pika.connect(
            url,
            client_properties={"connection_name": self._name, "product": "outbox-relay"},
            ssl=self._tls is not None,
            ssl_context=None if self._tls is None else tls_context(self._tls),
        )
        try:
            # Confirms: a retry's copy and a dead letter are published before the delivery is
            # acked, confirmed, or the delivery is not acked and comes again.
            channel = await connection.channel(publisher_confirms=True)
            await channel.set_qos(prefetch_count=self._prefetch)
            queue = await channel.get_queue(self._queue, ensure=True)
            while not stop.is_set():
                log.info(
                    "consuming %s",
                    self._queue,
                    extra={"action": "inbox_consuming", "queue": self._queue},
                )
                paused = await self._consume(queue, stop)
                if paused is None:
                    break
                if paused:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(stop.wait(), paused)
                else:
                    await until_ready(self._ready, self._backoff, stop)
        finally:
            with contextlib.suppress(*LOST):
                await connection.close()

    async def _consume(
        self, queue: aio_pika.abc.AbstractQueue, stop: asyncio.Event
    ) -> float | None:
        """Consume until ``stop`` (None) or an answer that pauses: then the consumer is
        cancelled, the deliveries prefetched go back to the queue, and the pause is the
        database's (0: until it answers) or a refused copy's (its seconds)."""
        inbound: asyncio.Queue[AbstractIncomingMessage] = asyncio.Queue()
        tag = await queue.consume(inbound.put)
        try:
            while not stop.is_set():
                try:
                    message = await asyncio.wait_for(inbound.get(), self._tick)
                except TimeoutError:
                    # A connection lost while nothing was in hand raises nowhere: looked at
                    # each tick, or the consumer would wait on it for good.
                    if queue.channel.is_closed:
                        raise ConnectionError("the broker's connection was lost") from None
                    continue
                verdict = await self._handle(delivery_of(message))
                try:
                    await answer(message, verdict, self._queue, self._dead_letters, self._refusals)
                except LOST:
                    raise  # the connection's: its unacked deliveries go back with it
                except Exception as exc:  # a copy refused, or an answer that failed otherwise
                    await message.reject(requeue=True)
                    return self._refusals.refused(self._queue, exc)
                finally:
                    if verdict.interrupted is not None:  # the handler's cancellation, say
                        raise verdict.interrupted
                if verdict.pause:
                    return 0.0
            return None
        finally:
            with contextlib.suppress(*LOST):
                await queue.cancel(tag)
            while not inbound.empty():  # prefetched, not handled: back to the queue now
                with contextlib.suppress(*LOST):
                    await inbound.get_nowait().reject(requeue=True)


async def until_ready(
    ready: Callable[[], Awaitable[bool]], backoff: Backoff, stop: asyncio.Event
) -> None:
    """Until ``ready`` says yes, asked with back-off between its looks, or ``stop`` is set."""
    failures = 0
    while not stop.is_set():
        failures += 1
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), backoff.delay(failures))
        if stop.is_set() or await ready():
            return


async def answer(
    message: AbstractIncomingMessage,
    verdict: Answer,
    queue: str,
    dead: str,
    refusals: Refusals,
) -> None:
    """Answer the broker for ``message`` (consumed from ``queue``) with ``verdict``, on the
    channel it came on (which must have publisher confirms): a delay publishes a copy to the
    retry queue for its delay, a dead letter with reasons publishes a copy to ``dead``, each
    confirmed before the delivery is acked (``CopyRefused`` when the broker refuses it: the
    delivery is not answered; a dead letter its queue refuses waits in a retry queue
    instead, ``Answer``); a retry requeues it; a dead letter without reasons goes to the
    queue's own dead-letter exchange."""
    if verdict.verdict is Verdict.ACK:
        await _settled(message, message.ack())
    elif verdict.verdict is Verdict.DELAY:
        await _retry_copy(message, queue, verdict.delay)
        await _settled(message, message.ack())
    elif verdict.verdict is Verdict.DEAD_LETTER and verdict.reason is not None:
        try:
            await _ensure_queue(message.channel, dead)
            await _publish_copy(message, dead, verdict.reason)
        except CopyRefused as exc:
            refusals.held_back(message.message_id, verdict.delay, exc)
            await _retry_copy(message, queue, verdict.delay)
        await _settled(message, message.ack())
    else:
        retry = verdict.verdict is Verdict.RETRY
        if not await _settled(message, message.reject(requeue=retry)) and retry:
            # Gone from the queue: a copy in its place.
            await _publish_copy(message, queue, retried(message.headers))
    if verdict.verdict in (Verdict.DELAY, Verdict.DEAD_LETTER):
        refusals.accepted()


async def _settled(message: AbstractIncomingMessage, answering: Awaitable[None]) -> bool:
    """Whether the delivery was answered here; False when the handler had answered it
    itself (FastStream hands it the message: ``await message.ack()``). A copy the answer
    needed is published before, and a retry's is published in its place: the handler's ack
    took the message off the queue, and the inbox's requeue, refused, lost it (an outside
    review)."""
    try:
        await answering
    except aio_pika.exceptions.MessageProcessError:
        log.warning(
            "message %s was answered by its handler: the inbox's answer is a copy's, if any",
            message.message_id,
            extra={"action": "inbox_answered_by_handler", "message_id": message.message_id},
        )
        return False
    return True


async def _retry_copy(message: AbstractIncomingMessage, queue: str, delay: float) -> None:
    """A copy of ``message`` in ``queue``'s retry queue of ``delay``, confirmed. Refused
    there, a delivery its handler answered itself (no delivery goes back to its queue when
    the copy fails) has its copy put in ``queue`` itself, tried again at once rather than
    after its delay: the handler's ack had taken it off the queue, and the requeue that
    follows a refusal, refused too, lost it (an outside review)."""
    target = await _retry_queue(message.channel, queue, delay)
    try:
        await _publish_copy(message, target, retried(message.headers))
    except CopyRefused:
        if not message.processed:
            raise
        await _publish_copy(message, queue, retried(message.headers))


async def _ensure_queue(channel: aiormq.abc.AbstractChannel, queue: str) -> None:
    """``relay.broker.consumer.ensure_queue`` on aio-pika: ``queue`` declared durable unless
    it is there, as it is, on channels of its own (the delivery's is FastStream's, or the
    consumer's: a look at a queue that is not there would close it)."""
    look = await channel.connection.channel()
    try:
        await look.queue_declare(queue, passive=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        declare = await channel.connection.channel()
        await declare.queue_declare(queue, durable=True)
        await declare.close()
    else:
        await look.close()


async def _retry_queue(channel: aiormq.abc.AbstractChannel, queue: str, delay: float) -> str:
    """``relay.broker.copies.retry_queue``'s queue for ``delay``, declared."""
    name, arguments = retry_queue(queue, delay)
    await channel.queue_declare(name, durable=True, arguments=arguments)
    return name


async def _publish_copy(
    message: AbstractIncomingMessage, queue: str, more: Mapping[str, object]
) -> None:
    """A persistent copy of ``message`` with ``more`` headers to ``queue``, confirmed
    (``CopyRefused`` for a nack or a return: the delivery is not acked). Without a
    ``user_id`` or an ``expiration`` (``relay.broker.consumer._with_headers`` says why)."""
    properties = copy.copy(message.properties)  # the delivery's own, for another copy
    properties.headers = {**(message.headers or {}), **more}  # type: ignore[dict-item]
    properties.delivery_mode = 2
    properties.user_id = None
    properties.expiration = None
    ce_id = key_of(None, message.headers or {})
    if not properties.message_id and ce_id and len(ce_id.encode()) <= SHORT_STRING_MAX_BYTES:
        # aiormq gives a message published without an id a random one: a copy of a message
        # keyed by its ce-id would come back under another key (processed again, its
        # attempts counted afresh). Its ce-id as its id keeps the key it had (one too long
        # for an id is no key: such a message is only ever dead-lettered).
        properties.message_id = ce_id
    frame_max = message.channel.connection.connection_tune.frame_max
    if not fits_a_frame(len(ContentHeader(0, len(message.body), properties).marshal()), frame_max):
        log_unfitting(message.message_id, more)
        properties.headers = message.headers
    try:
        confirmed = await message.channel.basic_publish(
            message.body, exchange="", routing_key=queue, properties=properties, mandatory=True
        )
    except (aiormq.exceptions.DeliveryError, aiormq.exceptions.PublishError) as exc:
        raise CopyRefused(f"{queue}: {type(exc).__name__}") from exc
    if not isinstance(confirmed, Basic.Ack):  # a return, where returns do not raise
        raise CopyRefused(f"{queue}: returned")


def delivery_of(message: AbstractIncomingMessage) -> Delivery:
    headers: dict[str, object] = dict(message.headers or {})
    message_id = message.message_id
    return Delivery(
        # As pika gives it: the bytes of an id that is not UTF-8, for the inbox to refuse.
        message_id=message_id.raw if isinstance(message_id, Undecodable) else message_id,
        body=message.body,
        exchange=message.exchange or "",
        routing_key=message.routing_key or "",
        content_type=message.content_type,
        headers=headers,
        redelivered=bool(message.redelivered) or RETRY_HEADER in headers,
    )
