"""The inbox's dead letters on the broker (``relay inbox list`` and ``requeue``): read every
message of a dead-letter queue without taking it, and move those chosen back to the queue
they came from.

Each message is fetched unacknowledged (``basic.get``), so none is seen twice in one pass; the
chosen ones whose queue is there (a passive declare) are handed to ``before_moving`` (the
inbox's attempts of theirs forgotten, so that each comes back with its whole retry
schedule), then each is published to its queue with confirms and then acked; the others go
back to the dead-letter queue together at the end, in their order. A pass that fails midway
(the connection lost, ``before_moving`` raising) leaves every message not yet acked where it
was; ``MoveFailed`` names those moved. A letter's attempts are forgotten only when it is
about to move: only a queue deleted between the look and the publish leaves a letter
dead-lettered with its attempts forgotten (it stays, named by the failure).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel

from relay.broker.connection import connection_parameters
from relay.broker.queue_kind import unreadable
from relay.errors import BrokerError, InputError
from relay.records import (
    DEAD_ATTEMPTS,
    DEAD_CONSUMER,
    DEAD_ERROR,
    DEAD_HEADERS,
    DEAD_LAST_FAILURE,
    DEAD_QUEUE,
    RETRY_HEADER,
    key_of,
)
from relay.settings import TlsOptions

# The header a quorum queue counts a message's deliveries in.
DELIVERY_COUNT = "x-delivery-count"


@dataclass(frozen=True)
class DeadLetter:
    """A dead letter as its headers describe it (empty where the broker put it there, not the
    inbox: a queue's delivery limit, a TTL)."""

    message_id: str | None
    # What the inbox kept it under: its message id, or its ce-id (None: it had no such key).
    key: str | None
    error: str
    attempts: int
    consumer: str
    queue: str
    last_failure: str
    # Times the broker delivered it (a quorum queue's count, each read here among them: at
    # its delivery limit the broker drops it), or 0 where the queue counts none.
    deliveries: int = 0


@dataclass(frozen=True)
class Listing:
    """A dead-letter queue as the console shows it: the letters read, how many the queue
    held when it was looked at, and why none were read when it is a queue a read could
    drop or reorder letters of (``relay.broker.queue_kind``)."""

    letters: list[DeadLetter]
    depth: int
    unreadable: str = ""
    depth_after: int = 0  # the letters ready once these were put back

    @property
    def partial(self) -> bool:
        """Fewer letters read than the queue held: another reader (a second view, `relay
        inbox`, a requeue) had the others in hand while these were read, or they arrived
        meanwhile."""
        return not self.unreadable and len(self.letters) < max(self.depth, self.depth_after)


def listing(urls: Sequence[str], name: str, tls: TlsOptions | None, dead_queue: str) -> Listing:
    """``dead_queue``'s letters, read only when reading them loses or reorders none: a
    classic queue without a delivery limit (others: their depth and why)."""
    with _connected(urls, name, tls, dead_queue) as connection:
        depth = _depth(connection.channel(), dead_queue)
        why = unreadable(connection, dead_queue)
        if why:
            return Listing([], depth, why)
        letters = _read(connection, dead_queue, depth, None, None)
        return Listing(letters, depth, depth_after=_depth(connection.channel(), dead_queue))


def dead_letters(
    urls: Sequence[str],
    name: str,
    tls: TlsOptions | None,
    dead_queue: str,
    *,
    move: Callable[[DeadLetter], bool] | None = None,
    before_moving: Callable[[list[DeadLetter]], None] | None = None,
    readable_only: bool = False,
) -> list[DeadLetter]:
    """Every message of ``dead_queue``, described; with ``move``, the ones it picks whose
    queue is there are handed to ``before_moving``, then put back into the queue they came
    from (their reason headers taken off), and those moved returned alone (``MoveFailed``,
    naming them, when moving fails midway). ``readable_only``: a queue a read could drop or reorder
    letters of (``relay.broker.queue_kind``) is refused (InputError), none read."""
    with _connected(urls, name, tls, dead_queue) as connection:
        depth = _depth(connection.channel(), dead_queue)
        if readable_only and (why := unreadable(connection, dead_queue)):
            raise InputError(f"{dead_queue!r} is not read here: {why}")
        return _read(connection, dead_queue, depth, move, before_moving)


@contextlib.contextmanager
def _connected(
    urls: Sequence[str], name: str, tls: TlsOptions | None, dead_queue: str
) -> Iterator[pika.BlockingConnection]:
    try:
        connection = pika.BlockingConnection(connection_parameters(urls[0], name, tls))
    except (pika.exceptions.AMQPError, OSError) as exc:
        raise BrokerError(f"cannot reach the broker: {type(exc).__name__}: {exc}") from exc
    try:
        yield connection
    except pika.exceptions.AMQPError as exc:
        raise BrokerError(f"reading {dead_queue!r} failed: {type(exc).__name__}: {exc}") from exc
    finally:
        with contextlib.suppress(pika.exceptions.AMQPError, OSError):
            connection.close()


def _depth(channel: BlockingChannel, dead_queue: str) -> int:
    try:
        return int(channel.queue_declare(dead_queue, passive=True).method.message_count)
    except pika.exceptions.ChannelClosedByBroker as exc:
        raise BrokerError(f"no dead-letter queue {dead_queue!r}: {exc.reply_text}") from exc


def _read(
    connection: pika.BlockingConnection,
    dead_queue: str,
    waiting: int,
    move: Callable[[DeadLetter], bool] | None,
    before_moving: Callable[[list[DeadLetter]], None] | None,
) -> list[DeadLetter]:
    channel = connection.channel()
    channel.confirm_delivery()
    found: list[DeadLetter] = []
    chosen: list[tuple[int, pika.BasicProperties, bytes, DeadLetter]] = []
    for _ in range(waiting):
        method, properties, body = channel.basic_get(dead_queue, auto_ack=False)
        if method is None:
            break
        letter = _described(properties)
        if move is None:
            found.append(letter)
        elif letter.queue and move(letter):
            chosen.append((method.delivery_tag, properties, body, letter))
            found.append(letter)
    if move is None:
        channel.basic_nack(0, multiple=True, requeue=True)  # all back, in their order
        return found
    # A letter whose queue is gone stays (nothing forgotten of it): moving it would fail.
    there: dict[str, bool] = {}
    movable = [c for c in chosen if _exists(connection, c[3].queue, there)]
    if movable and before_moving is not None:
        before_moving([letter for *_, letter in movable])
    moved: list[DeadLetter] = []
    try:
        for tag, properties, body, letter in movable:
            properties.headers = {
                k: v
                for k, v in (properties.headers or {}).items()
                if k not in DEAD_HEADERS and k != RETRY_HEADER
            }
            channel.basic_publish("", letter.queue, body, properties, mandatory=True)
            channel.basic_ack(tag)
            moved.append(letter)
        # The rest back to the dead-letter queue, in their order.
        channel.basic_nack(0, multiple=True, requeue=True)
    except pika.exceptions.AMQPError as exc:
        # Those not acked go back when the connection closes, in their order.
        raise MoveFailed(moved, exc) from exc
    return moved


class MoveFailed(BrokerError):
    """Moving dead letters failed midway: ``moved`` went back to their queues first."""

    def __init__(self, moved: list[DeadLetter], cause: BaseException) -> None:
        super().__init__(f"moving dead letters failed after {len(moved)}: {type(cause).__name__}")
        self.moved = moved
        self.cause = cause


def _exists(connection: pika.BlockingConnection, queue: str, there: dict[str, bool]) -> bool:
    """Whether ``queue`` is there (a passive declare, on a channel of its own: a look at a
    queue that is not there closes its channel), remembered in ``there``."""
    if queue not in there:
        look = connection.channel()
        try:
            look.queue_declare(queue, passive=True)
        except pika.exceptions.ChannelClosedByBroker:
            there[queue] = False
        else:
            look.close()
            there[queue] = True
    return there[queue]


def _described(properties: pika.BasicProperties) -> DeadLetter:
    headers = properties.headers or {}

    def text(name: str) -> str:
        value = headers.get(name)
        if isinstance(value, bytes):
            return value.decode("utf-8", "replace")
        return "" if value is None else str(value)

    message_id = properties.message_id
    key = key_of(message_id, headers)
    if isinstance(message_id, bytes):
        message_id = message_id.decode("utf-8", "replace")
    attempts = headers.get(DEAD_ATTEMPTS)
    deliveries = headers.get(DELIVERY_COUNT)
    return DeadLetter(
        message_id=message_id,
        key=key,
        error=text(DEAD_ERROR) or "(no reason: dead-lettered by the broker, not the inbox)",
        attempts=attempts if isinstance(attempts, int) else 0,
        consumer=text(DEAD_CONSUMER),
        queue=text(DEAD_QUEUE),
        last_failure=text(DEAD_LAST_FAILURE),
        deliveries=deliveries if isinstance(deliveries, int) else 0,
    )
