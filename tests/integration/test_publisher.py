"""The publisher alone against a real RabbitMQ node: what goes on the wire."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import pytest

from devtools.broker import drain, names, simple_topology
from devtools.servers import RabbitNode, free_port
from relay.backoff import Backoff
from relay.broker.publisher import PikaPublisher
from relay.records import BrokerNode, OutboxRow, Outcome, Settlement
from tests.support.fakes import lasting_lease
from tests.support.inprocess import wait_for
from tests.support.rows import row


def publish(publisher: PikaPublisher, rows: list[OutboxRow]) -> list[OutboxRow]:
    """Publish ``rows``; the rows that went out."""
    publisher.publish(rows)
    answers = publisher.take()
    assert answers.settled == []
    return answers.published


async def settlements(publisher: PikaPublisher, count: int) -> list[Settlement]:
    """The publisher's next ``count`` settlements, as they come."""
    settled: list[Settlement] = []
    while len(settled) < count:
        settled.extend(publisher.take().settled)
        await asyncio.sleep(0.05)
    return settled


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
            [rabbit.url],
            simple_topology(exchange, queue),
            window=1000,
            confirm_timeout=30,
            reconnect=Backoff(0.05, 1),
            lease=lasting_lease(),
        )
        running = asyncio.create_task(publisher.run(lambda: None))
        await wait_for(lambda: publisher.connected, 30, "connected")
        monkeypatch.setattr(socket.socket, "send", counting_send)
        assert publish(publisher, rows) == rows
        settled = await asyncio.wait_for(settlements(publisher, len(rows)), 30)
        monkeypatch.undo()
        assert {s.outcome for s in settled} == {Outcome.ACKED}
        await publisher.close()
        await running

    asyncio.run(scenario())
    # Unpatched pika sends each frame on its own: three per message, 900 here.
    assert 0 < len(sends) <= 10, sends
    delivered = drain(rabbit.url, queue, expect=len(rows))
    assert [d.message_id for d in delivered] == [r.message_id for r in rows]


def test_moves_on_to_the_next_node_when_one_refuses_or_dies(
    rabbit: RabbitNode, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Three addresses: nothing listens on the first, the second is a node the test kills,
    the third the session's node. Two separate nodes stand in for a cluster's: what is tested
    here is which node the publisher uses, and what it reports about it."""
    exchange, queue = names("nodes")
    doomed = RabbitNode(tmp_path_factory.mktemp("doomed"), name="relay-doomed")
    doomed.start()
    nodes: list[BrokerNode | None] = []

    async def publish_and_confirm(publisher: PikaPublisher, first: int) -> None:
        rows = [row(i, exchange=exchange, message_id=f"nodes-{i}") for i in range(first, first + 5)]
        assert publish(publisher, rows) == rows
        settled = await settlements(publisher, len(rows))
        assert {s.outcome for s in settled} == {Outcome.ACKED}

    async def scenario() -> None:
        publisher = PikaPublisher(
            [f"amqp://guest:guest@127.0.0.1:{free_port()}/%2F", doomed.url, rabbit.url],
            simple_topology(exchange, queue),
            window=100,
            confirm_timeout=5,
            reconnect=Backoff(0.05, 1),
            lease=lasting_lease(),
            on_state=nodes.append,
        )
        running = asyncio.create_task(publisher.run(lambda: None))
        await wait_for(lambda: publisher.connected, 30, "connected")
        await asyncio.wait_for(publish_and_confirm(publisher, 1), 30)
        doomed.kill()
        await wait_for(lambda: len(nodes) == 3 and publisher.connected, 30, "reconnected")
        await asyncio.wait_for(publish_and_confirm(publisher, 6), 30)
        await publisher.close()
        await running

    try:
        asyncio.run(scenario())
    finally:
        doomed.kill()
    first, lost, second, closed = nodes
    assert first is not None and first.address == f"127.0.0.1:{doomed.port}"
    assert first.product == "RabbitMQ" and first.version.startswith("3.")
    assert first.frame_max > 0
    assert lost is None
    assert second is not None and second.address == f"127.0.0.1:{rabbit.port}"
    assert closed is None
    delivered = drain(rabbit.url, queue, expect=5)
    assert [d.message_id for d in delivered] == [f"nodes-{i}" for i in range(6, 11)]


def header(listening: socket.socket) -> socket.socket:
    """The connection accepted on ``listening`` once its AMQP 0-9-1 protocol header came."""
    listening.settimeout(30)
    peer, _ = listening.accept()
    peer.settimeout(30)
    assert peer.recv(8, socket.MSG_WAITALL) == b"AMQP\x00\x00\x09\x01"
    return peer


def test_closing_while_a_connection_is_still_opening_is_clean() -> None:
    """A stop can come while the publisher is still opening a connection (here to a socket
    that accepts and never answers): the close lets the opening end rather than abort it,
    which pika cannot do cleanly (pika#970: a failed assertion in a callback)."""
    errors: list[dict[str, Any]] = []
    with socket.create_server(("127.0.0.1", 0)) as silent:
        url = f"amqp://guest:guest@127.0.0.1:{silent.getsockname()[1]}/%2F"

        async def scenario() -> None:
            asyncio.get_running_loop().set_exception_handler(lambda _l, c: errors.append(c))
            exchange, queue = names("opening")
            publisher = PikaPublisher(
                [url],
                simple_topology(exchange, queue),
                window=10,
                confirm_timeout=1,
                reconnect=Backoff(0.05, 1),
                lease=lasting_lease(),
            )
            running = asyncio.create_task(publisher.run(lambda: None))
            # The close comes once the protocol header is sent, which no answer follows.
            peer = await asyncio.wait_for(asyncio.to_thread(header, silent), 30)
            with peer:
                assert not publisher.connected
                await asyncio.wait_for(publisher.close(), 30)
                await asyncio.wait_for(running, 30)

        asyncio.run(scenario())
    assert errors == []
