"""Whether a queue's letters can be read and put back without any dropped or reordered,
learnt from the broker by declares (``relay.broker.queue_kind``), on both RabbitMQ versions;
and the dead-letter listing that reads only those queues."""

from __future__ import annotations

import uuid
from typing import Any

import pika
import pytest

from devtools.servers import RabbitNode
from relay.broker.deadletter_pages import Bounds, Position, letter_page
from relay.broker.queue_kind import unreadable


@pytest.mark.parametrize(
    "durable, arguments, why",
    [
        (True, None, ""),
        (False, None, ""),
        (True, {"x-queue-type": "classic"}, ""),
        (True, {"x-max-length": 1000, "x-dead-letter-exchange": "elsewhere"}, ""),
        (True, {"x-message-ttl": 60000, "x-queue-mode": "lazy"}, ""),
        (True, {"x-queue-type": "quorum"}, "it is a quorum queue"),
        (True, {"x-queue-type": "quorum", "x-delivery-limit": 3}, "it is a quorum queue"),
        (True, {"x-queue-type": "stream"}, "it is a stream queue"),
    ],
)
def test_a_queue_is_readable_only_when_classic(
    rabbit: RabbitNode, durable: bool, arguments: dict[str, Any] | None, why: str
) -> None:
    queue = f"kind.{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    try:
        channel = connection.channel()
        channel.queue_declare(queue, durable=durable, arguments=arguments)
        channel.confirm_delivery()
        for n in range(3):
            channel.basic_publish("", queue, str(n).encode(), mandatory=True)
        # (A stream counts its messages otherwise: its depth here is what it says before.)
        before = channel.queue_declare(queue, passive=True).method.message_count
        assert unreadable(connection, queue) == why
        # The looks changed nothing: the queue, its arguments and its messages are as they were.
        same = connection.channel()
        assert same.queue_declare(queue, passive=True).method.message_count == before
        same.queue_declare(queue, durable=durable, arguments=arguments)
        same.queue_delete(queue)
    finally:
        connection.close()


def test_a_quorum_dead_letter_queue_is_counted_never_read(rabbit: RabbitNode) -> None:
    queue = f"kind.{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    try:
        channel = connection.channel()
        channel.queue_declare(
            queue, durable=True, arguments={"x-queue-type": "quorum", "x-delivery-limit": 1}
        )
        channel.confirm_delivery()
        for n in range(5):
            channel.basic_publish("", queue, str(n).encode())
        for _ in range(3):  # each read would have spent a delivery: at the limit, dropped
            found = letter_page(
                [rabbit.url], "test", None, queue, position=Position(), bounds=Bounds(10, 10, 5)
            )
            assert found.letters == [] and found.depth == 5
            assert found.unreadable == "it is a quorum queue"
        assert channel.queue_declare(queue, passive=True).method.message_count == 5
        channel.queue_delete(queue)
    finally:
        connection.close()
