"""An inbox queue's dead letters in the console: shown with their x-inbox-* headers, read
without losing or reordering any, and requeued (as `relay inbox requeue`) by an operator,
audited; the console's metrics count the change."""

from __future__ import annotations

import re
import threading
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pika
import sqlalchemy as sa

from devtools.broker import drain, fresh_queue
from devtools.servers import RabbitNode, free_port
from relay.db.schema import console_audit, inbox_attempts
from relay.inbox.policy import dead_letter_queue
from tests.support.console import SCRIPT, follow, signed_in

NUL_KEY = "order-\x004"


def dead_letter(
    channel: pika.adapters.blocking_connection.BlockingChannel,
    queue: str,
    n: int,
    key: str | None = None,
) -> None:
    headers = {
        "x-inbox-error": f"ValueError: bad order {n} {SCRIPT}",
        "x-inbox-attempts": 5,
        "x-inbox-consumer": "billing",
        "x-inbox-queue": queue,
        "x-inbox-first-failure": "2026-11-27T10:00:00Z",
        "x-inbox-last-failure": "2026-11-27T10:01:00Z",
        "tenant": "a",
    }
    message_id = key or f"order-{n}"
    properties = pika.BasicProperties(message_id=message_id, headers=headers, delivery_mode=2)
    channel.basic_publish("", dead_letter_queue(queue), f"body {n}".encode(), properties)


def test_dead_letters_are_shown_in_order_and_requeued_by_an_operator(
    sqlite_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    queue = f"console.{uuid.uuid4().hex[:8]}"
    fresh_queue(rabbit.url, queue)
    fresh_queue(rabbit.url, dead_letter_queue(queue))
    connection = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    channel = connection.channel()
    for n in range(4):
        dead_letter(channel, queue, n)
    # A key HTML cannot carry back as it is (a browser reads a NUL in a value as U+FFFD).
    dead_letter(channel, queue, 4, NUL_KEY)
    connection.close()
    metrics = free_port()
    with signed_in(
        sqlite_url,
        tmp_path,
        "otto",
        RELAY_AMQP_URL=rabbit.url,
        RELAY_CONSOLE_INBOX_QUEUES=queue,
        RELAY_CONSOLE_METRICS_PORT=str(metrics),
    ) as (console, chromium, page):
        for _ in range(2):  # read twice: nothing taken, nothing reordered
            page.goto(f"{console.url}/inbox/{queue}")
            rows = page.locator("#letters tbody tr").all()
            shown = [r.locator("td").nth(2).inner_text() for r in rows]
            assert shown[:4] == [f"order-{n}" for n in range(4)] and len(shown) == 5
        first = rows[0].inner_text()
        assert f"ValueError: bad order 0 {SCRIPT}" in first and "billing" in first
        assert "\t5\t" in first and "2026-11-27T10:01:00Z" in first
        for n in (2, 4):  # order-2, and the NUL key's letter
            page.check(f"#letters tbody tr >> nth={n} >> input[name=letter]")
        follow(page, "#requeue-selected")
        assert page.inner_text("#confirm-count").startswith(
            "2 dead letters chosen will go back to their queue."
        )
        follow(page, "#confirm")
        assert page.inner_text("#changed") == "2 moved back to their queue, of the 5 letters read."
        page.goto(f"{console.url}/inbox/{queue}")
        left = [
            r.locator("td").nth(2).inner_text() for r in page.locator("#letters tbody tr").all()
        ]
        assert left == ["order-0", "order-1", "order-3"]
        page.goto(f"{console.url}/audit")
        assert "requeue_dead_letters" in page.inner_text("#audit tbody tr >> nth=0")
        assert chromium.dialogs == [] and chromium.errors == []
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=5) as answer:
            exported = answer.read().decode()
        assert 'console_actions_total{action="requeue_dead_letters",result="done"} 1.0' in exported
        assert 'console_rows_changed_total{action="requeue_dead_letters"} 2.0' in exported
    requeued, nul = drain(rabbit.url, queue, expect=2)
    assert requeued.message_id == "order-2" and requeued.body == b"body 2"
    assert requeued.headers == {"tenant": "a"}  # the reason headers taken off
    assert nul.message_id == NUL_KEY and nul.body == b"body 4"


def test_a_dead_letter_queue_a_read_would_drop_or_reorder_is_counted_not_read(
    sqlite_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    queue = f"console.{uuid.uuid4().hex[:8]}"
    connection = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    channel = connection.channel()
    channel.queue_declare(
        dead_letter_queue(queue),
        durable=True,
        arguments={"x-queue-type": "quorum", "x-delivery-limit": 1},
    )
    channel.confirm_delivery()
    for n in range(6):
        dead_letter(channel, queue, n)
    with signed_in(
        sqlite_url,
        tmp_path,
        "otto",
        RELAY_AMQP_URL=rabbit.url,
        RELAY_CONSOLE_INBOX_QUEUES=queue,
    ) as (console, chromium, page):
        for _ in range(4):  # each read would have spent one of the letter's deliveries
            page.goto(f"{console.url}/inbox/{queue}")
            said = page.inner_text("#unlisted")
            assert said.startswith("6 dead letters, not listed: it is a quorum queue")
            assert page.locator("#letters").count() == 0
        assert chromium.dialogs == [] and chromium.errors == []
    depth = channel.queue_declare(dead_letter_queue(queue), passive=True).method.message_count
    connection.close()
    assert depth == 6


def test_views_of_a_dead_letter_queue_at_once_each_show_every_letter(
    sqlite_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    queue = f"console.{uuid.uuid4().hex[:8]}"
    fresh_queue(rabbit.url, dead_letter_queue(queue))
    connection = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    channel = connection.channel()
    channel.confirm_delivery()
    for n in range(40):
        dead_letter(channel, queue, n)
    connection.close()
    with signed_in(
        sqlite_url,
        tmp_path,
        "vera",
        RELAY_AMQP_URL=rabbit.url,
        RELAY_CONSOLE_INBOX_QUEUES=queue,
    ) as (console, chromium, _page):
        (session,) = [c for c in chromium.context.cookies() if c["name"] == "relay_console"]
        go = threading.Barrier(4)

        def view(_n: int) -> str:
            request = urllib.request.Request(
                f"{console.url}/inbox/{queue}",
                headers={"Cookie": f"relay_console={session['value']}"},
            )
            go.wait()
            with urllib.request.urlopen(request, timeout=120) as answer:
                return str(answer.read().decode())

        with ThreadPoolExecutor(4) as pool:
            pages = list(pool.map(view, range(4)))
        for shown in pages:
            assert re.findall(r">(order-\d+)</a></td>", shown) == [f"order-{n}" for n in range(40)]
            assert 'id="partial"' not in shown


def test_a_letter_whose_queue_is_gone_stays_with_its_attempts_and_the_audit_says_so(
    sqlite_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    queue = f"console.{uuid.uuid4().hex[:8]}"
    fresh_queue(rabbit.url, queue)
    fresh_queue(rabbit.url, dead_letter_queue(queue))
    connection = pika.BlockingConnection(pika.URLParameters(rabbit.url))
    channel = connection.channel()
    channel.confirm_delivery()
    for n, target in enumerate((queue, f"{queue}.gone")):
        headers = {"x-inbox-error": "e", "x-inbox-consumer": "billing", "x-inbox-queue": target}
        properties = pika.BasicProperties(message_id=f"order-{n}", headers=headers)
        channel.basic_publish("", dead_letter_queue(queue), b"x", properties)
    connection.close()
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:
        conn.execute(
            sa.insert(inbox_attempts),
            [{"consumer": "billing", "message_id": f"order-{n}", "attempts": 5} for n in range(2)],
        )
    with signed_in(
        sqlite_url,
        tmp_path,
        "otto",
        RELAY_AMQP_URL=rabbit.url,
        RELAY_CONSOLE_INBOX_QUEUES=queue,
    ) as (console, chromium, page):
        page.goto(f"{console.url}/inbox/{queue}")
        page.check("#letters tbody tr >> nth=0 >> input[name=letter]")
        page.check("#letters tbody tr >> nth=1 >> input[name=letter]")
        gone = page.input_value("#letters tbody tr >> nth=1 >> input[name=letter]")
        follow(page, "#requeue-selected")
        follow(page, "#confirm")
        assert page.inner_text("#changed") == "1 moved back to their queue, of the 2 letters read."
        assert page.inner_text("#left-letters tbody") == (
            f"order-1\tits queue is not there ({queue}.gone)"
        )
        assert chromium.dialogs == [] and chromium.errors == []
    with engine.connect() as conn:
        kept = conn.execute(sa.select(inbox_attempts.c.message_id)).scalars().all()
        (entry,) = conn.execute(sa.select(console_audit)).all()
    engine.dispose()
    assert kept == ["order-1"]  # forgotten only for the letter that moved
    assert (entry.action, entry.rows) == ("requeue_dead_letters", 1)
    assert entry.result == (
        f"done: 1 of the 2 letters read; left 1 (its queue is not there ({queue}.gone)): {gone}"
    )
    (moved,) = drain(rabbit.url, queue, expect=1)
    (stayed,) = drain(rabbit.url, dead_letter_queue(queue), expect=1)
    assert (moved.message_id, stayed.message_id) == ("order-0", "order-1")
