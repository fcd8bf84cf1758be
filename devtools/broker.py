"""The broker from outside the relay: topology files, declaring, and draining queues."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

import pika

from relay.broker.topology import Binding, Exchange, Queue, Topology


@dataclass(frozen=True)
class Delivered:
    body: bytes
    routing_key: str
    message_id: str
    content_type: str | None
    headers: dict[str, Any] | None
    delivery_mode: int | None
    properties: pika.BasicProperties | None = None  # all of them, as they came


def names(prefix: str) -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return f"{prefix}.x.{suffix}", f"{prefix}.q.{suffix}"


def simple_topology(
    exchange: str, queue: str, queue_arguments: dict[str, Any] | None = None, routing_key: str = "#"
) -> Topology:
    return Topology(
        exchanges=(Exchange(exchange, type="topic"),),
        queues=(Queue(queue, arguments=queue_arguments or {}),),
        bindings=(Binding(exchange, queue, routing_key),),
    )


def write_topology(path: Path, topology: Topology) -> Path:
    """``topology`` as the TOML file ``RELAY_TOPOLOGY_FILE`` reads (defaults left out)."""
    sections: list[tuple[str, tuple[Exchange | Queue | Binding, ...]]] = [
        ("exchange", topology.exchanges),
        ("queue", topology.queues),
        ("binding", topology.bindings),
    ]
    lines = []
    for section, items in sections:
        for item in items:
            lines.append(f"[[{section}]]")
            for f in fields(item):
                value = asdict(item)[f.name]
                if value != f.default and value not in ({}, None):
                    lines.append(f"{f.name} = {_toml(value)}")
            lines.append("")
    path.write_text("\n".join(lines))
    return path


def _toml(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{json.dumps(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)  # strings and numbers are spelled alike in JSON and TOML


def declare_bound(url: str, exchange: str, queue: str) -> None:
    """A durable topic exchange and a durable queue bound to it for every routing key."""
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        channel = conn.channel()
        channel.exchange_declare(exchange, "topic", durable=True)
        channel.queue_declare(queue, durable=True)
        channel.queue_bind(queue, exchange, "#")


def fresh_queue(url: str, queue: str, arguments: dict[str, Any] | None = None) -> None:
    """``queue``, durable and empty: deleted and declared again (a queue still holding an
    earlier measurement's messages confirms more slowly), with ``arguments``."""
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        channel = conn.channel()
        channel.queue_delete(queue)
        channel.queue_declare(queue, durable=True, arguments=arguments)


def drain(url: str, queue: str, expect: int, timeout: float = 30.0) -> list[Delivered]:
    """Consume (with manual acks) until ``expect`` messages arrived and the queue stays empty
    for a moment, or ``timeout`` seconds pass without a message; never trusts the queue's
    counters. The bound is on a wait, not on the whole: one ``basic.get`` a message, 6,000
    of them took longer than 60 s beside the suite's load (a CI check: the destinations
    test found good rows missing that were still in the queue)."""
    out: list[Delivered] = []
    deadline = time.monotonic() + timeout
    with pika.BlockingConnection(pika.URLParameters(url)) as conn:
        channel = conn.channel()
        quiet_since = None
        while time.monotonic() < deadline:
            method, props, body = channel.basic_get(queue, auto_ack=False)
            if method is None:
                if len(out) >= expect:
                    quiet_since = quiet_since or time.monotonic()
                    if time.monotonic() - quiet_since > 0.5:
                        break
                conn.sleep(0.02)
                continue
            quiet_since = None
            deadline = time.monotonic() + timeout
            channel.basic_ack(method.delivery_tag)
            out.append(
                Delivered(
                    body,
                    method.routing_key,
                    props.message_id,
                    props.content_type,
                    props.headers,
                    props.delivery_mode,
                    props,
                )
            )
    return out


@contextlib.contextmanager
def holding(url: str, queue: str, letters: int) -> Iterator[None]:
    """A consumer of ``queue`` holding its first ``letters`` messages unacknowledged (as
    another reader does) until the block ends, when they go back."""
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.basic_qos(prefetch_count=letters)
        held: list[int] = []
        channel.basic_consume(queue, lambda _c, m, _p, _b: held.append(m.delivery_tag))
        while len(held) < letters:
            connection.process_data_events(0.1)
        yield
