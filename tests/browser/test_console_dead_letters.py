"""An inbox queue of many dead letters in the console: a page at a time, counted, said to be
partial when another reader holds letters; requeued by reason (their attempts forgotten, as
`relay inbox requeue` does); purged by an admin only; every letter reachable, whatever its
key, with its properties and payload."""

from __future__ import annotations

import uuid
from pathlib import Path

import pika
import sqlalchemy as sa

from devtools.broker import drain, fresh_queue, holding
from devtools.servers import RabbitNode
from relay.console_constants import CONSOLE_DEAD_LETTERS_PAGE
from relay.db.schema import console_audit, inbox_attempts
from relay.inbox.policy import dead_letter_queue
from tests.support.console import SCRIPT, follow, log_in, signed_in

LETTERS = 250  # two full pages and a half


def publish(url: str, queue: str, letters: list[tuple[object, str, bytes]]) -> None:
    """Dead letters as the inbox writes them: (message id, reason, payload) each."""
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for message_id, reason, body in letters:
            headers = {
                "x-inbox-error": reason,
                "x-inbox-attempts": 5,
                "x-inbox-consumer": "billing",
                "x-inbox-queue": queue,
            }
            properties = pika.BasicProperties(
                message_id=message_id,  # bytes too: as the wire has it
                headers=headers,
                content_type="application/json",
                delivery_mode=2,
            )
            channel.basic_publish("", dead_letter_queue(queue), body, properties)


def queues(url: str) -> str:
    queue = f"console.{uuid.uuid4().hex[:8]}"
    fresh_queue(url, queue)
    fresh_queue(url, dead_letter_queue(queue))
    return queue


def settings(rabbit: RabbitNode, queue: str) -> dict[str, str]:
    return {"RELAY_AMQP_URL": rabbit.url, "RELAY_CONSOLE_INBOX_QUEUES": queue}


def shown(page: object) -> list[str]:
    rows = page.locator("#letters tbody tr").all()  # type: ignore[attr-defined]
    return [r.locator("td").nth(2).inner_text() for r in rows]


def test_many_dead_letters_are_paged_counted_said_partial_and_requeued_by_reason(
    sqlite_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    queue = queues(rabbit.url)
    publish(
        rabbit.url,
        queue,
        [(f"order-{n}", f"ValueError: tenant-{n % 3} {SCRIPT}", b"{}") for n in range(LETTERS)],
    )
    engine = sa.create_engine(sqlite_url)
    with engine.begin() as conn:  # the inbox's attempts of two letters, one of each reason
        conn.execute(
            sa.insert(inbox_attempts),
            [
                {"consumer": "billing", "message_id": k, "attempts": 5}
                for k in ("order-1", "order-2")
            ],
        )
    with signed_in(sqlite_url, tmp_path, "otto", **settings(rabbit, queue)) as (
        console,
        chromium,
        page,
    ):
        answer = page.goto(f"{console.url}/inbox/{queue}")
        assert answer is not None and len(answer.body()) < 200_000  # one view was 1.8 MB
        assert page.inner_text("#count strong") == str(LETTERS)
        # The first page read its letters and one more, not the queue.
        assert page.inner_text("#read").startswith(
            "Read from the queue's head without taking them (101 read, at most 50000 and 5.0 s"
        )
        assert (
            page.inner_text("#range") == f"Letters 1 to {CONSOLE_DEAD_LETTERS_PAGE} of the queue."
        )
        assert shown(page) == [f"order-{n}" for n in range(CONSOLE_DEAD_LETTERS_PAGE)]
        assert page.locator("#partial").count() == 0
        follow(page, "#next-page")
        second = page.url
        assert shown(page) == [f"order-{n}" for n in range(100, 200)]
        # Another reader holds ten letters: the count leaves them out, and the page says so.
        with holding(rabbit.url, dead_letter_queue(queue), 10):
            page.goto(f"{console.url}/inbox/{queue}")
            assert page.inner_text("#count strong") == str(LETTERS - 10)
            assert "This page may be partial: another reader" in page.inner_text("#partial")
        # Requeue by reason: every letter of it, not only this page's.
        page.goto(f"{console.url}/inbox/{queue}")
        page.fill("#reason", "tenant-1")
        follow(page, "#requeue-reason")
        assert page.inner_text("#confirm-count").startswith(
            "83 dead letters whose reason holds tenant-1 of the 250 read"
        )
        follow(page, "#confirm")
        assert (
            page.inner_text("#changed") == "83 moved back to their queue, of the 250 letters read."
        )
        assert page.locator("#left, #unread").count() == 0
        # The second page is still the letters after the first page's last, nearer the head.
        page.goto(second)
        assert shown(page)[:3] == ["order-101", "order-102", "order-104"]
        assert page.inner_text("#count strong") == str(LETTERS - 83)
        assert chromium.dialogs == [] and chromium.errors == []
    with engine.connect() as conn:
        kept = conn.execute(sa.select(inbox_attempts.c.message_id)).scalars().all()
        (entry,) = conn.execute(sa.select(console_audit)).all()
    engine.dispose()
    assert kept == ["order-2"]  # forgotten for the letter requeued only
    assert (entry.action, entry.rows) == ("requeue_dead_letters", 83)
    assert '"scope": "reason", "reason": "tenant-1"' in entry.target
    moved = drain(rabbit.url, queue, expect=83)
    assert [m.message_id for m in moved] == [f"order-{n}" for n in range(1, LETTERS, 3)]


def test_a_purge_is_an_admins_and_every_letter_is_reachable_whatever_its_key(
    sqlite_url: str, rabbit: RabbitNode, tmp_path: Path
) -> None:
    queue = queues(rabbit.url)
    big = b"\xff\x00" + b"x" * 10_000
    publish(
        rabbit.url,
        queue,
        [
            ("order-\x001", "E", b"one"),  # a NUL: no form carries it back as it is
            (None, "E", b'{"no": "key"}'),  # no key at all
            (b"\xff\xfe", "E", big),  # a message id that is not UTF-8, a binary payload
            ("order-4", "E", b"four"),
        ],
    )
    with signed_in(sqlite_url, tmp_path, "otto", **settings(rabbit, queue)) as (
        console,
        chromium,
        page,
    ):
        page.goto(f"{console.url}/inbox/{queue}")
        assert page.locator("#purge-selected, #purge-reason, #purge-all").count() == 0
        # A forged purge, with the operator's own CSRF token: refused.
        csrf = page.input_value("#selection input[name=csrf]")
        letter = page.input_value("#letters tbody tr >> nth=0 >> input[name=letter]")
        for path in ("/confirm", "/act"):
            answer = page.request.post(
                console.url + path,
                form={
                    "csrf": csrf,
                    "action": "purge_dead_letters",
                    "queue": queue,
                    "letter": letter,
                },
            )
            assert answer.status == 403 and "a purge needs the admin role" in answer.text()
        # The letter with no key, and its payload; the binary one's, shown as hex, cut.
        follow(page, "#letters tbody tr >> nth=1 >> a")
        assert page.inner_text("#letter-key") == "(no key)"
        assert page.inner_text("#payload") == '{"no": "key"}'
        page.go_back()
        follow(page, "#letters tbody tr >> nth=2 >> a")
        assert "message_id\n\ufffd\ufffd" in page.inner_text("#properties")
        assert page.inner_text("#payload-size") == "10002 bytes, the first 4096 shown"
        assert page.inner_text("#payload").startswith("00000000  ff 00 78")
        with page.expect_download() as download:
            page.click("#download")
        assert Path(download.value.path()).read_bytes() == big
        # An operator requeues the NUL key's letter, the no-key one and the binary one.
        page.goto(f"{console.url}/inbox/{queue}")
        for n in range(3):
            page.check(f"#letters tbody tr >> nth={n} >> input[name=letter]")
        follow(page, "#requeue-selected")
        follow(page, "#confirm")
        assert page.inner_text("#changed") == "3 moved back to their queue, of the 4 letters read."
        # An admin purges the rest.
        log_in(page, console.url, "ada")
        page.goto(f"{console.url}/inbox/{queue}")
        follow(page, "#purge-all")
        assert page.inner_text("#confirm-count").startswith("1 dead letters of the 1 read")
        # A letter dead-lettered after the confirmation was drawn: not the admin's to purge.
        publish(rabbit.url, queue, [("order-5", "E", b"five")])
        follow(page, "#confirm")
        assert page.inner_text("#changed") == "1 purged, of the 1 letters read."
        assert page.inner_text("#later").startswith("1 letters came into the queue after")
        page.goto(f"{console.url}/inbox/{queue}")
        assert page.inner_text("#count strong") == "1"
        assert chromium.dialogs == [] and chromium.errors == []
    requeued = drain(rabbit.url, queue, expect=3)
    assert [m.body for m in requeued] == [b"one", b'{"no": "key"}', big]
    assert requeued[0].message_id == "order-\x001"
