"""CloudEvents on the wire (``RELAY_CLOUDEVENTS``): what the relay sends is read as CloudEvents
by the CloudEvents SDK's own RabbitMQ binding (binary mode), not by the relay's idea of it."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import pytest
from cloudevents.core.bindings.rabbitmq import RabbitMQMessage, from_binary
from cloudevents.core.formats.json import JSONFormat

from devtools.broker import drain, names, simple_topology
from devtools.servers import RabbitNode
from relay.records import SENT, NewMessage
from tests.support.inprocess import Running, enqueue, rows_by_status, settings, wait_for


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_cloudevents_sdk_reads_what_the_relay_sends(
    database_url: str, rabbit: RabbitNode
) -> None:
    exchange, queue = names("cloudevents")
    config = settings(database_url, rabbit.url, cloudevents="true", cloudevents_source="/shop")
    orders = [
        NewMessage(
            json.dumps({"order": n}).encode(),
            exchange,
            "order.paid",
            content_type="application/json",
            headers=json.dumps({"ce-type": "com.shop.order.paid"} if n % 2 else {"tenant": "a"}),
            message_id=f"order-{n}",
        )
        for n in range(6)
    ]
    before = datetime.now(UTC)

    async def scenario() -> None:
        async with Running(config, simple_topology(exchange, queue)) as parts:
            enqueue(parts, orders)
            await wait_for(lambda: rows_by_status(parts) == {SENT: 6}, 30, "every row sent")

    asyncio.run(scenario())
    events = {}
    for delivered in drain(rabbit.url, queue, 6):
        assert delivered.headers is not None
        message = RabbitMQMessage(delivered.headers, delivered.content_type, delivered.body)
        event = from_binary(message, JSONFormat())
        events[event.get_id()] = event
        assert event.get_id() == delivered.message_id  # the inbox keys on either
    assert sorted(events) == [f"order-{n}" for n in range(6)]
    for n in range(6):
        event = events[f"order-{n}"]
        assert event.get_specversion() == "1.0"
        assert event.get_source() == "/shop"
        assert event.get_type() == ("com.shop.order.paid" if n % 2 else "order.paid")
        assert event.get_datacontenttype() == "application/json"
        assert event.get_data() == {"order": n}
        time = event.get_time()
        assert time is not None and before.replace(microsecond=0) <= time <= datetime.now(UTC)
