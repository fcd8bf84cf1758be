"""A blocking consumer of one queue, for the inbox (``relay.inbox``): deliveries handed to a
function one at a time, each answered as it says (ack, requeue, or dead-letter), through
the broker's nodes in turn with back-off when a connection fails. pika's errors end here.

One delivery at a time, in the thread that calls ``run``: the handler's transaction and the
ack are in order, and nothing else shares the channel. The prefetch keeps the next
deliveries on their way while one is handled.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from relay.backoff import Backoff
from relay.broker.connection import address, connection_parameters
from relay.broker.copies import (
    REFUSED,
    Refusals,
    fits_a_frame,
    log_unfitting,
    retried,
    retry_queue,
)
from relay.broker.rotation import Rotation
from relay.records import RETRY_HEADER, Answer, Delivery, Verdict
from relay.settings import TlsOptions

log = logging.getLogger(__name__)

# What a broken connection or channel raises in pika's blocking adapter, and the socket's own.
_LOST = (pika.exceptions.AMQPError, OSError)
# A content header frame's fixed bytes (class, weight, body size), before the properties
# (``relay.broker.copies.fits_a_frame`` adds the frame's envelope).
CONTENT_HEADER_FIXED = 12
# AMQP's reply code for a queue that is not there.
_NOT_FOUND = 404


class Consumer:
    """Consumes ``queue`` from the first of ``urls`` that answers, handing each delivery to
    ``handle`` and answering the broker with its verdict; calls ``idle`` when nothing came
    for ``tick`` seconds (and at least that often while busy), where its owner's periodic work
    goes. An answer that pauses cancels the consumer until ``ready`` says yes (asked with
    back-off, the connection serviced meanwhile); a dead letter with its reasons goes to the
    queue ``dead_letters``; a copy the broker refuses is told to ``refused``. ``run`` returns
    once ``stop`` is set."""

    def __init__(
        self,
        urls: Sequence[str],
        name: str,
        tls: TlsOptions | None,
        *,
        queue: str,
        prefetch: int,
        handle: Callable[[Delivery], Answer],
        idle: Callable[[], None],
        ready: Callable[[], bool],
        dead_letters: str,
        tick: float,
        backoff: Backoff,
        refused: Callable[[], None],
    ) -> None:
        self._params = [connection_parameters(url, name, tls) for url in urls]
        self._queue = queue
        self._prefetch = prefetch
        self._handle = handle
        self._idle = idle
        self._ready = ready
        self._dead_letters = dead_letters
        self._dead_declared = False
        self._tick = tick
        self._backoff = backoff
        self._refusals = Refusals(backoff, refused)

    def run(self, stop: threading.Event) -> None:
        nodes = Rotation(self._params, self._backoff)
        while not stop.is_set():
            params = nodes.node
            try:
                self._session(params, stop)
                nodes.worked()
            except _LOST as exc:
                delay = nodes.failed()
                log_retry(address(params), self._queue, nodes.failures, delay, _reason(exc))
                self._idle()
                stop.wait(delay)

    def _session(self, params: pika.URLParameters, stop: threading.Event) -> None:
        connection = pika.BlockingConnection(params)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self._prefetch)
            # A retry's copy is published before its delivery is acked: confirmed, or the
            # delivery is not acked and comes again.
            channel.confirm_delivery()
            retry_queues: dict[float, str] = {}
            while not stop.is_set():
                log.info(
                    "consuming %s from %s",
                    self._queue,
                    address(params),
                    extra={"action": "inbox_consuming", "queue": self._queue},
                )
                paused = self._consume(channel, retry_queues, stop)
                if paused is None:
                    break
                if paused:
                    self._sleep(connection, paused, stop)
                else:
                    self._wait_until_ready(connection, stop)
        finally:
            if connection.is_open:
                with contextlib.suppress(*_LOST):
                    connection.close()

    def _consume(
        self,
        channel: BlockingChannel,
        retry_queues: dict[float, str],
        stop: threading.Event,
    ) -> float | None:
        """Consume until ``stop`` (None) or an answer that pauses: then the consumer is
        cancelled, the deliveries prefetched go back to the queue, and the pause is the
        database's (0: until it answers) or a refused copy's (its seconds)."""
        last_idle = time.monotonic()
        for method, properties, body in channel.consume(self._queue, inactivity_timeout=self._tick):
            if stop.is_set():
                break
            if method is None or time.monotonic() - last_idle >= self._tick:
                last_idle = time.monotonic()
                self._idle()
            if method is not None:
                answer = self._handle(_delivery(method, properties, body))
                tag = method.delivery_tag
                try:
                    self._answer(
                        channel,
                        tag,
                        properties=properties,
                        body=body,
                        answer=answer,
                        retry_queues=retry_queues,
                    )
                except Exception as exc:  # a copy refused, or an answer that failed otherwise
                    if isinstance(exc, _LOST) and not isinstance(exc, REFUSED):
                        raise  # the connection's: its unacked deliveries go back with it
                    # Declared afresh next time: a queue deleted under the consumer returns.
                    retry_queues.clear()
                    self._dead_declared = False
                    channel.basic_reject(tag, requeue=True)
                    channel.cancel()
                    return self._refusals.refused(self._queue, exc)
                finally:
                    if answer.interrupted is not None:  # the handler's Ctrl-C, say: goes on
                        raise answer.interrupted
                if answer.pause:
                    channel.cancel()  # its unacked deliveries go back now
                    return 0.0
            if stop.is_set():  # now, not after the next delivery or tick
                break
        # Unacked deliveries go back to the queue with the connection.
        return None

    def _answer(
        self,
        channel: BlockingChannel,
        tag: int,
        *,
        properties: pika.BasicProperties,
        body: bytes,
        answer: Answer,
        retry_queues: dict[float, str],
    ) -> None:
        """The broker answered for a delivery as ``answer`` says; a copy (a retry's, a dead
        letter's) confirmed before the delivery is acked (``REFUSED`` when it is not). A
        dead letter its queue refuses waits in a retry queue instead (``Answer``)."""
        if answer.verdict is Verdict.ACK:
            channel.basic_ack(tag)
        elif answer.verdict is Verdict.DELAY:
            self._retry_copy(channel, answer.delay, properties, body, retry_queues)
            channel.basic_ack(tag)
        elif answer.verdict is Verdict.DEAD_LETTER and answer.reason is not None:
            dead = _with_headers(properties, answer.reason, self._frame_max(channel))
            try:
                channel.basic_publish("", self._dead_queue(channel), body, dead, mandatory=True)
            except REFUSED as exc:
                self._dead_declared = False  # declared afresh: it may have been deleted
                self._refusals.held_back(properties.message_id, answer.delay, exc)
                self._retry_copy(channel, answer.delay, properties, body, retry_queues)
            channel.basic_ack(tag)
        else:
            channel.basic_reject(tag, requeue=answer.verdict is Verdict.RETRY)
        if answer.verdict in (Verdict.DELAY, Verdict.DEAD_LETTER):
            self._refusals.accepted()

    def _retry_copy(
        self,
        channel: BlockingChannel,
        delay: float,
        properties: pika.BasicProperties,
        body: bytes,
        retry_queues: dict[float, str],
    ) -> None:
        """A copy of the delivery in the retry queue of ``delay``, confirmed."""
        queue = retry_queues.get(delay) or self._retry_queue(channel, delay, retry_queues)
        again = _with_headers(properties, retried(properties.headers), self._frame_max(channel))
        channel.basic_publish("", queue, body, again, mandatory=True)

    @staticmethod
    def _frame_max(channel: BlockingChannel) -> int:
        """The frame size the broker and this connection agreed on."""
        return int(channel.connection._impl.params.frame_max)

    def _retry_queue(
        self, channel: BlockingChannel, delay: float, retry_queues: dict[float, str]
    ) -> str:
        """The queue where a message waits ``delay`` seconds (``retry_queue``), declared."""
        name, arguments = retry_queue(self._queue, delay)
        channel.queue_declare(name, durable=True, arguments=arguments)
        retry_queues[delay] = name
        return name

    def _dead_queue(self, channel: BlockingChannel) -> str:
        """The queue dead letters go to with their reasons, declared durable on first use
        unless it is there already, as it is (``ensure_queue``)."""
        if not self._dead_declared:
            ensure_queue(channel.connection, self._dead_letters)
            self._dead_declared = True
        return self._dead_letters

    def _wait_until_ready(self, connection: pika.BlockingConnection, stop: threading.Event) -> None:
        """Paused: no delivery in hand, the connection serviced (heartbeats) while the
        owner's ``ready`` says no, with back-off between its looks."""
        failures = 0
        while not stop.is_set():
            failures += 1
            self._sleep(connection, self._backoff.delay(failures), stop)
            if stop.is_set() or self._ready():
                return

    def _sleep(
        self, connection: pika.BlockingConnection, seconds: float, stop: threading.Event
    ) -> None:
        """``seconds`` or until ``stop``, the connection serviced (heartbeats) meanwhile."""
        deadline = time.monotonic() + seconds
        while not stop.is_set() and time.monotonic() < deadline:
            connection.sleep(min(self._tick, max(0.0, deadline - time.monotonic())))


def ensure_queue(connection: pika.BlockingConnection, queue: str) -> None:
    """``queue`` declared durable unless it is there, as it is: an operator may have declared
    the dead letters' queue with arguments of their own (a length limit, a type), which a
    declare with others would fail on. On channels of its own: a look at a queue that is not
    there closes its channel."""
    look = connection.channel()
    try:
        look.queue_declare(queue, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code != _NOT_FOUND:
            raise
        declare = connection.channel()
        declare.queue_declare(queue, durable=True)
        declare.close()
    else:
        look.close()


def log_retry(where: str, queue: str, failures: int, delay: float, reason: str) -> None:
    """One line per failed session, from either consumer."""
    log.warning(
        "broker %s: consuming %s failed (attempt %d), retrying in %.1fs: %s",
        where,
        queue,
        failures,
        delay,
        reason,
        extra={"action": "inbox_broker_retry"},
    )


def _with_headers(
    properties: pika.BasicProperties, more: Mapping[str, object], frame_max: int
) -> pika.BasicProperties:
    """A delivery's properties for a copy the consumer publishes: as they were, persistent,
    with ``more`` headers (unless they would not fit a frame: then without, logged);
    without a ``user_id`` (the broker refuses one that is not the consumer's own user,
    closing the channel) or an ``expiration`` (a copy waits out its retry queue's delay,
    and a dead letter stays until an operator moves it)."""
    copied = _copied(properties, {**(properties.headers or {}), **more})
    header_size = CONTENT_HEADER_FIXED + sum(map(len, copied.encode()))
    if more and not fits_a_frame(header_size, frame_max):
        log_unfitting(properties.message_id, more)
        copied = _copied(properties, properties.headers)
    return copied


def _copied(
    properties: pika.BasicProperties, headers: Mapping[str, object] | None
) -> pika.BasicProperties:
    return pika.BasicProperties(
        content_type=properties.content_type,
        content_encoding=properties.content_encoding,
        headers=dict(headers) if headers is not None else None,
        delivery_mode=2,
        priority=properties.priority,
        correlation_id=properties.correlation_id,
        reply_to=properties.reply_to,
        message_id=properties.message_id,
        timestamp=properties.timestamp,
        type=properties.type,
        app_id=properties.app_id,
    )


def _delivery(method: Any, properties: pika.BasicProperties, body: bytes) -> Delivery:
    headers = dict(properties.headers or {})
    return Delivery(
        message_id=properties.message_id,
        body=body,
        exchange=method.exchange,
        routing_key=method.routing_key,
        content_type=properties.content_type,
        headers=headers,
        redelivered=bool(method.redelivered) or RETRY_HEADER in headers,
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker) and exc.reply_code == _NOT_FOUND:
        return f"the queue does not exist ({exc.reply_text})"
    return f"{type(exc).__name__}: {exc}"
