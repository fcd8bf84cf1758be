"""What the inbox's two consumers (``relay.broker.consumer``, ``relay.broker.aio_consumer``)
share about the copies of a delivery they publish, a retry's or a dead letter's: the retry
queue a delay waits in, the header that counts a message's retries, whether a copy's
properties fit a frame, and what a copy the broker refuses does (the consumer pauses).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import pika.exceptions

from relay.backoff import Backoff
from relay.errors import BrokerError
from relay.records import RETRY_HEADER

log = logging.getLogger(__name__)

# A frame's envelope (type, channel, size, end), around a content header's bytes.
FRAME_ENVELOPE = 8
# What a confirmed, mandatory publish raises when the broker refuses the message.
REFUSED = (pika.exceptions.NackError, pika.exceptions.UnroutableError)


class CopyRefused(BrokerError):
    """The broker refused a copy of a delivery (a retry's, a dead letter's): nacked (a queue
    at its length limit that rejects publishes, a quorum queue without a leader) or returned
    (its queue deleted). The delivery goes back to its queue, uncounted, and the consumer
    pauses, with back-off while the refusals go on: nothing is dropped."""


class Refusals:
    """A consumer's copies refused in a row: each one pauses it longer (``Backoff``), and is
    told to ``counted`` (a metric)."""

    def __init__(self, backoff: Backoff, counted: Callable[[], None]) -> None:
        self._backoff = backoff
        self._counted = counted
        self.count = 0

    def refused(self, queue: str, exc: BaseException) -> float:
        """One more refusal, or answer that failed otherwise (an error of the consumer's own,
        the delivery unanswered): logged, counted; the seconds to pause."""
        self.count += 1
        self._counted()
        delay = self._backoff.delay(self.count)
        refused = isinstance(exc, (CopyRefused, *REFUSED))
        log.log(
            logging.WARNING if refused else logging.ERROR,
            "%s a delivery of %s (%s): the delivery goes back, uncounted; consuming again in %.1fs",
            "the broker refused a copy of" if refused else "the consumer failed to answer for",
            queue,
            type(exc).__name__,
            delay,
            extra={"action": "inbox_copy_refused" if refused else "inbox_answer_failed"},
        )
        return delay

    def held_back(self, message_id: object, delay: float, exc: BaseException) -> None:
        """A dead letter its queue refused, held in a retry queue instead: logged, counted."""
        self._counted()
        log.warning(
            "the dead letters' queue refused message %s (%s): it waits %g s in a retry queue, "
            "and is dead-lettered when it comes back",
            message_id,
            type(exc).__name__,
            delay,
            extra={"action": "inbox_dead_letter_held", "delay_s": delay},
        )

    def accepted(self) -> None:
        self.count = 0


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
    its retries), which the inbox treats as a delivery that came again (a producer's own
    header of that name that is not a count counts as none)."""
    retries = (headers or {}).get(RETRY_HEADER)
    counted = retries if isinstance(retries, int) and not isinstance(retries, bool) else 0
    return {RETRY_HEADER: max(counted, 0) + 1}


def fits_a_frame(header_size: int, frame_max: int) -> bool:
    """Whether a message's content header of ``header_size`` bytes (its fixed part and its
    properties) fits a frame: the broker closes the connection on one that does not (a
    message whose own headers come near the negotiated ``frame_max``, plus the inbox's)."""
    return header_size + FRAME_ENVELOPE <= frame_max


def log_unfitting(message_id: object, more: Mapping[str, object]) -> None:
    """A copy published without the inbox's headers: with them, its properties would not
    fit a frame."""
    log.error(
        "message %s's copy goes without the inbox's headers (%s): with them its properties "
        "would not fit a frame",
        message_id,
        ", ".join(more),
        extra={"action": "inbox_copy_headers_dropped", "message_id": message_id},
    )
