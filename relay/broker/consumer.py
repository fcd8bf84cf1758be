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
from collections.abc import Callable, Sequence
from typing import Any

import pika
import pika.exceptions

from relay.backoff import Backoff
from relay.broker.connection import address, connection_parameters
from relay.records import Delivery, Verdict
from relay.settings import TlsOptions

log = logging.getLogger(__name__)

# What a broken connection or channel raises in pika's blocking adapter, and the socket's own.
_LOST = (pika.exceptions.AMQPError, OSError)


class Consumer:
    """Consumes ``queue`` from the first of ``urls`` that answers, handing each delivery to
    ``handle`` and answering the broker with its verdict; calls ``idle`` when nothing came
    for ``tick`` seconds (and at least that often while busy), where its owner's periodic work
    goes. ``run`` returns once ``stop`` is set."""

    def __init__(
        self,
        urls: Sequence[str],
        name: str,
        tls: TlsOptions | None,
        *,
        queue: str,
        prefetch: int,
        handle: Callable[[Delivery], Verdict],
        idle: Callable[[], None],
        tick: float,
        backoff: Backoff,
    ) -> None:
        self._params = [connection_parameters(url, name, tls) for url in urls]
        self._queue = queue
        self._prefetch = prefetch
        self._handle = handle
        self._idle = idle
        self._tick = tick
        self._backoff = backoff

    def run(self, stop: threading.Event) -> None:
        failures = 0
        node = 0
        while not stop.is_set():
            params = self._params[node % len(self._params)]
            try:
                self._session(params, stop)
                failures = 0
            except _LOST as exc:
                failures += 1
                node += 1
                delay = self._backoff.delay(failures)
                log.warning(
                    "broker %s: consuming %s failed (attempt %d), retrying in %.1fs: %s",
                    address(params),
                    self._queue,
                    failures,
                    delay,
                    _reason(exc),
                    extra={"action": "inbox_broker_retry"},
                )
                self._idle()
                stop.wait(delay)

    def _session(self, params: pika.URLParameters, stop: threading.Event) -> None:
        connection = pika.BlockingConnection(params)
        try:
            channel = connection.channel()
            channel.basic_qos(prefetch_count=self._prefetch)
            log.info(
                "consuming %s from %s",
                self._queue,
                address(params),
                extra={"action": "inbox_consuming", "queue": self._queue},
            )
            last_idle = time.monotonic()
            for method, properties, body in channel.consume(
                self._queue, inactivity_timeout=self._tick
            ):
                if stop.is_set():
                    break
                if method is None or time.monotonic() - last_idle >= self._tick:
                    last_idle = time.monotonic()
                    self._idle()
                if method is not None:
                    verdict = self._handle(_delivery(method, properties, body))
                    if verdict is Verdict.ACK:
                        channel.basic_ack(method.delivery_tag)
                    else:
                        requeue = verdict is Verdict.RETRY
                        channel.basic_reject(method.delivery_tag, requeue=requeue)
                if stop.is_set():  # now, not after the next delivery or tick
                    break
            # Unacked deliveries go back to the queue with the connection.
        finally:
            if connection.is_open:
                with contextlib.suppress(*_LOST):
                    connection.close()


def _delivery(method: Any, properties: pika.BasicProperties, body: bytes) -> Delivery:
    return Delivery(
        message_id=properties.message_id,
        body=body,
        exchange=method.exchange,
        routing_key=method.routing_key,
        content_type=properties.content_type,
        headers=dict(properties.headers or {}),
        redelivered=bool(method.redelivered),
    )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, pika.exceptions.ChannelClosedByBroker) and exc.reply_code == 404:
        return f"the queue does not exist ({exc.reply_text})"
    return f"{type(exc).__name__}: {exc}"
