"""CloudEvents on the wire (``RELAY_CLOUDEVENTS``): what the relay sends is read as CloudEvents
by the CloudEvents SDK's own RabbitMQ binding (binary mode), not by the relay's idea of it."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from cloudevents.core.bindings.rabbitmq import RabbitMQMessage, from_binary
from cloudevents.core.formats.json import JSONFormat

from devtools.broker import drain, names, simple_topology
from devtools.outbox import insert
from devtools.servers import RabbitNode
from relay.records import PARKED, SENT, NewMessage
from tests.support.inprocess import Running, enqueue, rows_by_status, settings, table, wait_for


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


# A row's headers -> a part of the reason it is parked, or None: published, and read by the SDK.
ROWS = {
    "ce-order_id": ('{"ce-order_id": 7}', "lower-case letters and digits"),
    "empty-subject": ('{"ce-subject": ""}', "subject is text, not empty"),
    "two-sources": ('{"ce-source": "/a", "CE-Source": "/b"}', "name one CloudEvents attribute"),
    "local-time": ('{"ce-time": "2026-01-01T00:00:00"}', "RFC 3339"),
    "own-source": ('{"CE-Source": "/billing", "ce-Subject": "order-7"}', None),
    "own-time": ('{"ce-time": "2025-12-31T23:00:00+01:00"}', None),
    "extension": ('{"ce-tenant": "a", "plain": "b"}', None),
}


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_row_the_sdk_would_refuse_is_parked_naming_its_header_and_no_other(
    database_url: str, rabbit: RabbitNode
) -> None:
    """With CloudEvents on, every message that reaches the broker is one the SDK reads; the
    rows whose headers make a message it refuses are parked before they are sent."""
    exchange, queue = names("cloudevents")
    config = settings(database_url, rabbit.url, cloudevents="true", max_attempts=3)
    messages = [
        NewMessage(b"{}", exchange, "k", "application/json", headers, message_id=name)
        for name, (headers, _) in ROWS.items()
    ]
    messages.append(NewMessage(b"{}", exchange, "k", "", message_id="empty-content-type"))
    refused = {n: reason for n, (_, reason) in ROWS.items() if reason} | {
        "empty-content-type": "content_type",
        "": "CloudEvent's id (the row's message_id) must not be empty",
    }
    sent = len(messages) + 1 - len(refused)

    async def scenario() -> list[Any]:
        async with Running(config, simple_topology(exchange, queue)) as parts:
            enqueue(parts, messages)
            # An empty message id, as a plain-SQL writer may leave it (enqueue makes one up).
            row = {"message_id": "", "exchange": exchange, "routing_key": "k", "payload": b"{}"}
            insert(database_url, [row])
            want = {SENT: sent, PARKED: len(refused)}
            await wait_for(lambda: rows_by_status(parts) == want, 30, "every row settled")
            return table(parts)

    ended = {row.message_id: row for row in asyncio.run(scenario())}
    for message_id, reason in refused.items():
        assert ended[message_id].status == PARKED
        assert reason in (ended[message_id].last_error or ""), ended[message_id].last_error
    events = {}
    for delivered in drain(rabbit.url, queue, sent):
        assert delivered.headers is not None
        message = RabbitMQMessage(delivered.headers, delivered.content_type, delivered.body)
        events[delivered.message_id] = from_binary(message, JSONFormat())
    assert sorted(events) == sorted(set(ROWS) - set(refused))
    assert events["own-source"].get_source() == "/billing"
    assert events["own-source"].get_subject() == "order-7"
    assert events["own-time"].get_time() == datetime(2025, 12, 31, 22, tzinfo=UTC)
    assert events["extension"].get_extension("tenant") == "a"
