"""The values that travel along the data path: claimed rows, confirm outcomes, row changes;
a consumer's deliveries and answers, and the headers the inbox puts on the messages it
retries and dead-letters, which the broker's layer reads."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple

PENDING = "pending"
SENT = "sent"
PARKED = "parked"
STATUSES = (PENDING, SENT, PARKED)

# What stays of an acked row (setting ``keep_sent``): its ids in the sent log, or the row.
KEEP_IDS = "ids"
KEEP_MESSAGES = "messages"


class OutboxRow(NamedTuple):
    """A claimed outbox row, as the publisher needs it. ``headers`` is the stored JSON text.

    A named tuple, not a frozen dataclass: one is built per row claimed, and a frozen
    dataclass's ``__init__`` (a ``object.__setattr__`` per field) took 2.7 us of CPU, a named
    tuple 0.5 us. Immutable either way."""

    id: int
    message_id: str
    exchange: str
    routing_key: str
    payload: bytes
    content_type: str
    headers: str | None
    created_at: datetime  # aware, in any zone
    attempts: int
    last_error: str | None = None
    # Taken down with a channel the broker closed for a row it did not name: published only
    # alone, with nothing else in flight (``relay.broker.quarantine``).
    suspect: bool = False
    # Why the stored row could not be read (a value of the wrong type, say), or was not read
    # (larger than the relay's maximum message size), or None. Such a row carries only its id
    # and is parked by the ordinary path, as a rejected publish.
    unreadable: str | None = None
    # Its message id is in the sent log: a message acked before, written again within the
    # dedupe horizon (a re-run). Never published; settled DUPLICATE (its row deleted).
    sent_before: bool = False

    @property
    def size(self) -> int:
        """Bytes this row's payload holds in memory (what the byte budget counts)."""
        return len(self.payload)

    @property
    def republish(self) -> bool:
        """An earlier publish of this row is known to have failed or gone unconfirmed."""
        return self.last_error is not None


class Outcome(enum.Enum):
    ACKED = "acked"  # basic.ack, no basic.return before it: the broker owns the message
    NACKED = "nacked"  # basic.nack: the broker refused responsibility
    RETURNED = "returned"  # basic.return then basic.ack: unroutable, not delivered
    TIMED_OUT = "timed_out"  # no confirm within confirm_timeout
    FAILED = "failed"  # the broker closed the channel because of this row (e.g. no exchange)
    LOST = "lost"  # connection or channel gone, or shutdown, before the confirm: due again now
    REJECTED = "rejected"  # the row cannot be published as stored (malformed): parked at once
    DUPLICATE = "duplicate"  # its message id was sent before (``OutboxRow.sent_before``)


class Settlement(NamedTuple):
    """What became of one published (or unpublishable) row. A named tuple, as ``OutboxRow``
    is, and for the same reason: one per row published."""

    row: OutboxRow
    outcome: Outcome
    detail: str = ""
    latency: float | None = None  # seconds from publish to confirm, for ACKED
    # The row became a suspect (``OutboxRow.suspect``). A LOST row stays what it was.
    suspect: bool = False


@dataclass(frozen=True, slots=True)
class PublisherState:
    """The publisher as the loop reads it, at one moment (``relay.ports.Publisher.state``)."""

    connected: bool  # a confirm channel is open and the topology declared (maybe blocked)
    can_publish: bool  # connected, and not blocked by the broker
    in_flight: int  # rows published and awaiting the broker's answer
    capacity: int  # how many more rows may be published now
    broken: frozenset[str]  # the exchanges the broker refuses now: their rows are held


@dataclass(frozen=True, slots=True)
class Answers:
    """What the publisher has for the loop since it last asked (``Publisher.take``)."""

    published: list[OutboxRow]  # rows that went out (rows held back earlier among them)
    settled: list[Settlement]  # what became of rows handed over
    recovered: list[str]  # exchanges found again: their held rows should be due now


@dataclass(frozen=True, slots=True)
class BrokerNode:
    """The broker node a relay is connected to, as the node announced itself on connect."""

    address: str  # host:port, as in the relay's settings
    product: str  # "RabbitMQ"
    version: str  # "3.10.8", "4.0.5"
    cluster_name: str
    frame_max: int  # negotiated: a message's properties must fit one frame


@dataclass(frozen=True, slots=True)
class RowChange:
    """The new state of a row that was not acked; applied only while this relay holds it.
    ``delay``: seconds after the database's current time at which the row is due again
    (a duration, not a time: the relay's clock decides nothing, see ``relay.db.clock``)."""

    id: int
    status: str
    attempts: int
    delay: float
    last_error: str
    suspect: bool = False


@dataclass(frozen=True, slots=True)
class SettleBatch:
    """Everything one settle call writes: acked ids become sent, duplicates (rows whose
    message was sent before) leave the outbox, the rest change as given."""

    sent: tuple[int, ...] = ()
    changes: tuple[RowChange, ...] = ()
    duplicates: tuple[int, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.sent or self.changes or self.duplicates)

    def __len__(self) -> int:
        return len(self.sent) + len(self.changes) + len(self.duplicates)


@dataclass(frozen=True, slots=True)
class NewMessage:
    """A message to put in the outbox (``relay enqueue``, tests, the demo)."""

    payload: bytes
    exchange: str = ""
    routing_key: str = ""
    content_type: str = "application/octet-stream"
    headers: str | None = None  # JSON object text
    message_id: str | None = None  # default: a new UUID
    ordering_key: str | None = None


@dataclass(frozen=True, slots=True)
class BacklogStats:
    due: int
    oldest_due_age: float  # seconds the longest-waiting due row has been due; 0 when none


@dataclass(frozen=True, slots=True)
class Delivery:
    """A message as an inbox consumer's handler receives it (``relay.inbox``). ``headers``
    are pika's decoding of the AMQP table: long strings as ``str``."""

    # The AMQP property; the inbox keys on it, or on ``ce-id``. Bytes when the broker
    # carried bytes that are not UTF-8 (pika's decoding); such a message has no key.
    message_id: str | bytes | None
    body: bytes
    exchange: str
    routing_key: str
    content_type: str | None
    headers: dict[str, object]
    redelivered: bool

    @property
    def key(self) -> str | None:
        """The id the inbox remembers the message by (``key_of``)."""
        return key_of(self.message_id, self.headers)


def key_of(message_id: object, headers: Mapping[str, object]) -> str | None:
    """The id the inbox remembers a message by, as text: its message id, else its CloudEvents
    ``ce-id`` header (a CloudEvents producer that sets no message id); None when it has
    neither, or it is not UTF-8 text (bytes, or a byte array as pika sends bytes in a
    header). The same for a delivery and for a dead letter (``relay inbox requeue``)."""
    raw = message_id or headers.get("ce-id")
    if isinstance(raw, bytes | bytearray):
        try:
            raw = bytes(raw).decode("utf-8")
        except UnicodeDecodeError:
            return None
    return raw if isinstance(raw, str) and raw else None


class Verdict(enum.Enum):
    """What a consumer answers the broker for one delivery."""

    ACK = "ack"  # processed now, or before (a duplicate)
    RETRY = "retry"  # rejected with requeue: delivered again
    # Published to a retry queue whose messages expire back into the queue after a delay,
    # then acked: the broker holds the delay, not the consumer.
    DELAY = "delay"
    DEAD_LETTER = "dead_letter"  # rejected without requeue: to the queue's dead-letter exchange


# The header on a message the inbox put in a retry queue: how many times it did.
RETRY_HEADER = "x-inbox-retries"

# Headers on a message the inbox dead-lettered, saying why: written by the inbox
# (``relay.inbox.policy.dead_letter_headers``), read by the broker's dead-letter listing
# (``relay.broker.deadletters``), so here, below both.
DEAD_ERROR = "x-inbox-error"
DEAD_ATTEMPTS = "x-inbox-attempts"
DEAD_CONSUMER = "x-inbox-consumer"
DEAD_QUEUE = "x-inbox-queue"
DEAD_FIRST_FAILURE = "x-inbox-first-failure"
DEAD_LAST_FAILURE = "x-inbox-last-failure"
DEAD_HEADERS = (
    DEAD_ERROR,
    DEAD_ATTEMPTS,
    DEAD_CONSUMER,
    DEAD_QUEUE,
    DEAD_FIRST_FAILURE,
    DEAD_LAST_FAILURE,
)


class Answer(NamedTuple):
    """A consumer's answer for one delivery: its verdict; for ``DELAY``, the seconds; with
    ``pause``, the consumer stops consuming until its owner is ready again (the database is
    away: each delivery would fail the same way); for ``DEAD_LETTER``, the headers that say
    why, put on the dead letter, and as ``delay`` the seconds it waits in a retry queue
    instead when the dead letters' queue refuses it (full, say), to be dead-lettered when it
    comes back (the messages behind it go on meanwhile). ``interrupted``: what cut the
    handler off (a ``KeyboardInterrupt``, a ``SystemExit``, an ``asyncio.CancelledError``),
    raised by the consumer once the broker is answered, never swallowed."""

    verdict: Verdict
    delay: float = 0.0
    pause: bool = False
    reason: Mapping[str, object] | None = None
    interrupted: BaseException | None = None
