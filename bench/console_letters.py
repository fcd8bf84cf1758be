"""bench.console's part for an inbox queue's dead letters (``--parts letters``): on a private
RabbitMQ node, ``--letters`` dead letters as the inbox writes them (its headers; their
reasons naming one of ``--tenants`` tenants' exchanges, or one of four other causes), then
what the console does with them, each timed: the first page, the twentieth or the last
(each page after the one before, as its link names it), a count of every letter and of one
reason's (the confirm page's), a requeue by that reason and a purge of all (the done
pages'), each accounted for: letters moved, left and not read against those there."""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import pika

from devtools.servers import RabbitNode
from relay.admin.inbox import requeue
from relay.broker.deadletter_pages import Position, letter_page, tally
from relay.broker.deadletters import move_letters
from relay.console.letters import BOUNDS
from relay.inbox.policy import dead_letter_queue
from relay.records import DEAD_ATTEMPTS, DEAD_CONSUMER, DEAD_ERROR, DEAD_QUEUE
from relay.settings import Settings

QUEUE = "orders"
DEEP = 20  # the page a walk from the head reaches
REASONS = (
    "ValueError at handlers.py:41",
    "TransactionFailed: the inbox's commit failed: MySQL error 1213",
    "KeyError at handlers.py:88",
    "TimeoutError at client.py:120",
)


def reason(n: int, tenants: int) -> str:
    if n % 5 == 4:
        return f"PermissionError: no exchange 'orders-{n // 5 % tenants}' for tenant"
    return REASONS[n % 5]


def fill(url: str, letters: int, tenants: int) -> None:
    """The inbox's queue, and ``letters`` dead letters in its dead-letter queue."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        channel.queue_declare(QUEUE, durable=True)
        channel.queue_declare(dead_letter_queue(QUEUE), durable=True)
        channel.confirm_delivery()
        for n in range(letters):
            headers = {
                DEAD_ERROR: reason(n, tenants),
                DEAD_ATTEMPTS: 3,
                DEAD_CONSUMER: QUEUE,
                DEAD_QUEUE: QUEUE,
            }
            properties = pika.BasicProperties(message_id=f"m-{n}", headers=headers, delivery_mode=2)
            channel.basic_publish("", dead_letter_queue(QUEUE), b"x" * 200, properties)
    finally:
        connection.close()


def letters_cost(database_url: str, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="relay-letters-") as tmp:
        node = RabbitNode(Path(tmp) / "rabbit", name="relay-bench-letters")
        node.start()
        try:
            fill(node.url, args.letters, args.tenants)
            settings = Settings.load({}, {"database_url": database_url, "amqp_url": node.url})
            return _measured(settings, args)
        finally:
            node.stop()


def _measured(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    on = (settings.amqp_urls, settings.name, settings.amqp_tls, dead_letter_queue(QUEUE))
    found: dict[str, Any] = {"letters": args.letters}

    def timed(name: str, call: Any) -> Any:
        began = time.perf_counter()
        result = call()
        found[f"{name}_ms"] = round((time.perf_counter() - began) * 1000, 1)
        print(f"letters, {name}: {found[f'{name}_ms']} ms", flush=True)
        return result

    first = timed("first_page", lambda: letter_page(*on, position=Position(), bounds=BOUNDS))
    page, position = first, Position()
    for _ in range(DEEP - 1):
        if not page.more:  # fewer letters than DEEP pages: the last page
            break
        last_at, last = page.letters[-1]
        position = Position(last.digest, last_at, page.following)
        page = letter_page(*on, position=position, bounds=BOUNDS)
    deep = timed("deep_page", lambda: letter_page(*on, position=position, bounds=BOUNDS))
    found["deep_page_first_letter"] = deep.letters[0][0] if deep.letters else None
    found["deep_page_partial"] = deep.partial or deep.short
    every = timed("count_all", lambda: tally(*on, choose=lambda _: True, bounds=BOUNDS))
    found["count_all"] = {"matched": every.matched, "read": every.read, "depth": every.depth}
    chosen = REASONS[0]

    def picked(letter: Any) -> bool:
        return chosen in letter.error

    one = timed("count_reason", lambda: tally(*on, choose=picked, bounds=BOUNDS))
    found["count_reason"] = {"matched": one.matched, "read": one.read}
    moved = timed("requeue_reason", lambda: requeue(settings, QUEUE, picked, most=one.depth))
    found["requeue_reason"] = {
        "moved": len(moved.moved),
        "left": len(moved.left),
        "unread": max(0, moved.depth - moved.later - moved.read),
        "expected": one.matched,
    }
    purged = timed(
        "purge_all",
        lambda: move_letters(*on, lambda _: True, publish=False, readable_only=True),
    )
    found["purge_all"] = {
        "moved": len(purged.moved),
        "left": len(purged.left),
        "unread": max(0, purged.depth - purged.later - purged.read),
        "expected": args.letters - one.matched,
    }
    return found
