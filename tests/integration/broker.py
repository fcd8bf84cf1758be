"""Test-side broker access: declare, inspect and drain queues on the private node."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

import pika

from relay.topology import Binding, Exchange, Queue, Topology


@dataclass(frozen=True)
class Delivered:
    body: bytes
    routing_key: str
    message_id: str
    content_type: str | None
    headers: dict[str, Any] | None
    delivery_mode: int | None


def names(prefix: str) -> tuple[str, str]:
    suffix = uuid.uuid4().hex[:8]
    return f"{prefix}.x.{suffix}", f"{prefix}.q.{suffix}"


def simple_topology(exchange: str, queue: str, queue_arguments: dict[str, Any] | None = None,
                    routing_key: str = "#") -> Topology:  # fmt: skip
    return Topology(
        exchanges=(Exchange(exchange, type="topic"),),
        queues=(Queue(queue, arguments=queue_arguments or {}),),
        bindings=(Binding(exchange, queue, routing_key),),
    )


def declare_bound(url: str, exchange: str, queue: str) -> None:
    """A durable topic exchange and a durable queue bound to it for every routing key."""
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.exchange_declare(exchange, "topic", durable=True)
    channel.queue_declare(queue, durable=True)
    channel.queue_bind(queue, exchange, "#")
    conn.close()


def drain(url: str, queue: str, expect: int, timeout: float = 30.0) -> list[Delivered]:
    """Consume (with manual acks) until ``expect`` messages arrived and the queue stays empty
    for a moment, or the deadline passes; never trusts the queue's counters."""
    out: list[Delivered] = []
    deadline = time.monotonic() + timeout
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
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
            channel.basic_ack(method.delivery_tag)
            out.append(Delivered(body, method.routing_key, props.message_id, props.content_type,
                                 props.headers, props.delivery_mode))  # fmt: skip
    finally:
        conn.close()
    return out
