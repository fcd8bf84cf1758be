"""The publisher alone against a real RabbitMQ node: what goes on the wire."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from devtools.broker import drain, names, simple_topology
from devtools.servers import RabbitNode
from relay.backoff import Backoff
from relay.publisher import PikaPublisher
from relay.records import Outcome, Settlement
from tests.support.inprocess import wait_for
from tests.support.rows import row


def test_rows_published_in_one_call_go_out_in_a_few_writes_and_in_order(
    rabbit: RabbitNode, monkeypatch: pytest.MonkeyPatch
) -> None:
    exchange, queue = names("gather")
    sends: list[int] = []
    real_send = socket.socket.send

    def counting_send(sock: socket.socket, data: Any, *args: Any) -> int:
        sends.append(len(data))
        return real_send(sock, data, *args)

    rows = [
        row(i, exchange=exchange, routing_key="k", message_id=f"gather-{i}") for i in range(1, 301)
    ]

    async def scenario() -> None:
        publisher = PikaPublisher(
            rabbit.url,
            simple_topology(exchange, queue),
            window=1000,
            confirm_timeout=30,
            reconnect=Backoff(0.05, 1),
        )
        running = asyncio.create_task(publisher.run(lambda: None))
        await wait_for(lambda: publisher.connected, 30, "connected")
        monkeypatch.setattr(socket.socket, "send", counting_send)
        assert publisher.publish(rows) == rows
        settled: list[Settlement] = []

        async def confirmed() -> None:
            while len(settled) < len(rows):
                settled.extend(publisher.take_settled())
                await asyncio.sleep(0.05)

        await asyncio.wait_for(confirmed(), 30)
        monkeypatch.undo()
        assert {s.outcome for s in settled} == {Outcome.ACKED}
        await publisher.close()
        await running

    asyncio.run(scenario())
    # Unpatched pika sends each frame on its own: three per message, 900 here.
    assert 0 < len(sends) <= 10, sends
    delivered = drain(rabbit.url, queue, expect=len(rows))
    assert [d.message_id for d in delivered] == [r.message_id for r in rows]
