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
from relay.broker.rotation import Rotation
from relay.records import RETRY_HEADER, Answer, Delivery, Verdict
from relay.settings import TlsOptions

log = logging.getLogger(__name__)

# What a broken connection or channel raises in pika's blocking adapter, and the socket's own.
_LOST = (pika.exceptions.AMQPError, OSError)


class Consumer:
    """Consumes ``queue`` from the first of ``urls`` that answers, handing each delivery to
    ``handle`` and answering the broker with its verdict; calls ``idle`` when nothing came
    for ``tick`` seconds (and at least that often while busy), where its owner's periodic work
    goes. An answer that pauses cancels the consumer until ``ready`` says yes (asked with
    back-off, the connection serviced meanwhile); a dead letter with its reasons goes to the
    queue ``dead_letters``. ``run`` returns once ``stop`` is set."""

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
                if not self._consume(channel, retry_queues, stop):
                    break
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
    ) -> bool:
        """Consume until ``stop`` (False) or an answer that pauses (True): then the
        consumer is cancelled, and the deliveries prefetched go back to the queue."""
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
                if answer.verdict is Verdict.ACK:
                    channel.basic_ack(tag)
                elif answer.verdict is Verdict.DELAY:
                    queue = retry_queues.get(answer.delay) or self._retry_queue(
                        channel, answer.delay, retry_queues
                    )
                    again = _with_headers(properties, retried(properties.headers))
                    channel.basic_publish("", queue, body, again, mandatory=True)
                    channel.basic_ack(tag)
                elif answer.verdict is Verdict.DEAD_LETTER and answer.reason is not None:
                    dead = _with_headers(properties, answer.reason)
                    channel.basic_publish("", self._dead_queue(channel), body, dead, mandatory=True)
                    channel.basic_ack(tag)
                else:
                    channel.basic_reject(tag, requeue=answer.verdict is Verdict.RETRY)
                if answer.pause:
                    channel.cancel()  # its unacked deliveries go back now
                    return True
            if stop.is_set():  # now, not after the next delivery or tick
                break
        # Unacked deliveries go back to the queue with the connection.
        return False

    def _retry_queue(
        self, channel: BlockingChannel, delay: float, retry_queues: dict[float, str]
    ) -> str:
        """The queue where a message waits ``delay`` seconds (``retry_queue``), declared."""
        name, arguments = retry_queue(self._queue, delay)
        channel.queue_declare(name, durable=True, arguments=arguments)
        retry_queues[delay] = name
        return name

    def _dead_queue(self, channel: BlockingChannel) -> str:
        """The queue dead letters go to with their reasons, declared durable on first use."""
        if not self._dead_declared:
            channel.queue_declare(self._dead_letters, durable=True)
            self._dead_declared = True
        return self._dead_letters

    def _wait_until_ready(self, connection: pika.BlockingConnection, stop: threading.Event) -> None:
        """Paused: no delivery in hand, the connection serviced (heartbeats) while the
        owner's ``ready`` says no, with back-off between its looks."""
        failures = 0
        while not stop.is_set():
            failures += 1
            deadline = time.monotonic() + self._backoff.delay(failures)
            while not stop.is_set() and time.monotonic() < deadline:
                connection.sleep(min(self._tick, max(0.0, deadline - time.monotonic())))
            if stop.is_set() or self._ready():
                return


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


def retry_queue(queue: str, delay: float) -> tuple[str, dict[str, Any]]:
    """The queue where a message of ``queue`` waits ``delay`` seconds, and its arguments: its
    messages expire (a TTL) and are dead-lettered back into ``queue``, through the default
    exchange. One per delay of the schedule, declared on first use, durable, as the queue."""
    ttl = round(delay * 1000)
    arguments = {
        "x-message-ttl": ttl,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": queue,
    }
    return f"{queue}.retry.{ttl}ms", arguments


def retried(headers: Mapping[str, object] | None) -> dict[str, object]:
    """The header that marks a delivery's copy in a retry queue (``RETRY_HEADER``, counting
    its retries), which the inbox treats as a delivery that came again."""
    retries = (headers or {}).get(RETRY_HEADER, 0)
    return {RETRY_HEADER: int(retries or 0) + 1}  # type: ignore[call-overload]


def _with_headers(
    properties: pika.BasicProperties, more: Mapping[str, object]
) -> pika.BasicProperties:
    """A delivery's properties for a copy the consumer publishes: as they were, persistent,
    with ``more`` headers."""
    headers = {**(properties.headers or {}), **more}
    return pika.BasicProperties(
        content_type=properties.content_type,
        content_encoding=properties.content_encoding,
        headers=headers,
        delivery_mode=2,
        priority=properties.priority,
        correlation_id=properties.correlation_id,
        reply_to=properties.reply_to,
        message_id=properties.message_id,
        timestamp=properties.timestamp,
        type=properties.type,
        user_id=properties.user_id,
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
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker) and exc.reply_code == 404:
        return f"the queue does not exist ({exc.reply_text})"
    return f"{type(exc).__name__}: {exc}"
