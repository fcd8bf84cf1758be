"""An inbox queue's dead letters read a page at a time (``relay.broker.deadletter_pages``)
and moved (``relay.broker.deadletters``) on a real RabbitMQ: a page follows the letter
before it whatever leaves the queue, every read is bounded and says where it stopped, reads
back to back each see every letter, another reader is said, and a requeue or purge
accounts for every letter it chose."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pika
import pytest

from devtools.broker import drain, fresh_queue, holding
from devtools.servers import RabbitNode
from relay.broker.deadletter_pages import Bounds, LetterPage, Position, letter_page, tally
from relay.broker.deadletters import NO_QUEUE, QUEUE_GONE, move_letters
from relay.inbox.policy import dead_letter_queue

BIG = Bounds(size=100, limit=50_000, budget_s=30)


@pytest.fixture
def queue(rabbit: RabbitNode) -> Iterator[str]:
    name = f"pages.{uuid.uuid4().hex[:8]}"
    fresh_queue(rabbit.url, name)
    fresh_queue(rabbit.url, dead_letter_queue(name))
    yield name
    with pika.BlockingConnection(pika.URLParameters(rabbit.url)) as connection:
        channel = connection.channel()
        channel.queue_delete(name)
        channel.queue_delete(dead_letter_queue(name))


def dead_letters(url: str, queue: str, keys: list[str | None], reason: str = "E") -> None:
    with pika.BlockingConnection(pika.URLParameters(url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for n, key in enumerate(keys):
            headers = {"x-inbox-error": f"{reason} {n % 3}", "x-inbox-queue": queue}
            properties = pika.BasicProperties(message_id=key, headers=headers, delivery_mode=2)
            channel.basic_publish("", dead_letter_queue(queue), f"body {n}".encode(), properties)


def page(url: str, queue: str, position: Position = Position(), bounds: Bounds = BIG) -> LetterPage:  # noqa: B008
    return letter_page(
        [url], "test", None, dead_letter_queue(queue), position=position, bounds=bounds
    )


def keys(found: LetterPage) -> list[str | None]:
    return [letter.key for _, letter in found.letters]


def after(found: LetterPage) -> Position:
    at, letter = found.letters[-1]
    return Position(letter.digest, at, found.following)


def test_a_page_follows_the_letter_before_it_whatever_leaves_before(
    rabbit: RabbitNode, queue: str
) -> None:
    dead_letters(rabbit.url, queue, [f"order-{n}" for n in range(250)])
    first = page(rabbit.url, queue)
    assert keys(first) == [f"order-{n}" for n in range(100)]
    assert (first.depth, first.more, first.partial) == (250, True, False)
    second = page(rabbit.url, queue, after(first))
    assert keys(second) == [f"order-{n}" for n in range(100, 200)]
    assert [at for at, _ in second.letters] == list(range(100, 200))
    # Two letters before the page leave: the page is the same letters, two places nearer.
    gone = {"order-3", "order-50"}
    move_letters([rabbit.url], "test", None, dead_letter_queue(queue), lambda x: x.key in gone)
    again = page(rabbit.url, queue, after(first))
    assert keys(again) == keys(second) and again.letters[0][0] == 98
    # The letter it follows leaves: the page starts where that letter was, and says so.
    move_letters(
        [rabbit.url], "test", None, dead_letter_queue(queue), lambda x: x.key == "order-99"
    )
    lost = page(rabbit.url, queue, after(first))
    assert lost.lost and keys(lost) == [f"order-{n}" for n in range(100, 200)]
    # So has the one after it: the page starts at the place the first had, and says so.
    move_letters(
        [rabbit.url], "test", None, dead_letter_queue(queue), lambda x: x.key == "order-100"
    )
    lost = page(rabbit.url, queue, after(first))
    assert lost.lost and not lost.found and keys(lost)[0] == "order-104"
    third = page(rabbit.url, queue, after(second))
    assert keys(third) == [f"order-{n}" for n in range(200, 250)] and not third.more


def test_a_read_stops_at_its_bound_and_says_so(rabbit: RabbitNode, queue: str) -> None:
    dead_letters(rabbit.url, queue, [f"order-{n}" for n in range(300)])
    first = page(rabbit.url, queue)
    short = Bounds(size=100, limit=150, budget_s=30)
    second = page(rabbit.url, queue, after(first), short)
    assert keys(second) == [f"order-{n}" for n in range(100, 150)]
    assert (second.stopped, second.short, second.more) == ("limit", True, False)
    # Its last letter read is the one the next page follows: found, nothing after it read.
    third = page(rabbit.url, queue, Position(after(second).after, 149), short)
    assert (third.found, third.short, third.letters, third.read) == (True, True, [], 150)
    # A letter further in than the bound: not reached, which is not "gone".
    far = page(rabbit.url, queue, Position("0" * 32, 200), short)
    assert (far.found, far.lost, far.letters, far.stopped) == (False, False, [], "limit")
    # The letter it follows and the one after both gone, a page's worth after its place read
    # before the bound: no letter shown, and no next page (its link named the last shown:
    # the page was a 500, an outside review).
    gone = page(rabbit.url, queue, Position("0" * 32, 10, "1" * 32), short)
    assert (gone.found, gone.letters, gone.more) == (False, [], False)
    counted = tally(
        [rabbit.url], "test", None, dead_letter_queue(queue), choose=lambda _: True, bounds=short
    )
    assert (counted.matched, counted.read, counted.depth, counted.stopped) == (
        150,
        150,
        300,
        "limit",
    )


def test_reads_back_to_back_each_see_every_letter_in_order(rabbit: RabbitNode, queue: str) -> None:
    dead_letters(rabbit.url, queue, [f"order-{n}" for n in range(3000)])
    whole = Bounds(size=3000, limit=50_000, budget_s=30)
    for _ in range(4):  # each read put back before the next begins
        found = page(rabbit.url, queue, bounds=whole)
        assert keys(found) == [f"order-{n}" for n in range(3000)] and not found.partial


def test_a_reader_attached_to_the_queue_is_said(rabbit: RabbitNode, queue: str) -> None:
    dead_letters(rabbit.url, queue, [f"order-{n}" for n in range(30)])
    with holding(rabbit.url, dead_letter_queue(queue), 10):
        found = page(rabbit.url, queue)
        assert found.partial and found.readers == 1 and found.depth == 20
        assert keys(found) == [f"order-{n}" for n in range(10, 30)]
    found = page(rabbit.url, queue)
    assert keys(found) == [f"order-{n}" for n in range(30)] and not found.partial


def test_a_requeue_accounts_for_every_letter_it_chose_and_a_purge_takes_them(
    rabbit: RabbitNode, queue: str
) -> None:
    # Letters of every key: none, a NUL, bytes that are not UTF-8.
    dead_letters(rabbit.url, queue, ["order-0", None, "order-\x002"])
    with pika.BlockingConnection(pika.URLParameters(rabbit.url)) as connection:
        channel = connection.channel()
        channel.confirm_delivery()
        for n, (origin, message_id) in enumerate(
            ((None, "order-3"), (f"{queue}.gone", "order-4"), (queue, None))
        ):
            headers = {"x-inbox-error": "E 9", **({"x-inbox-queue": origin} if origin else {})}
            properties = pika.BasicProperties(message_id=message_id, headers=headers)
            channel.basic_publish("", dead_letter_queue(queue), f"b{n}".encode(), properties)
        raw = pika.BasicProperties(headers={"x-inbox-error": "E 9", "x-inbox-queue": queue})
        # A message id as bytes that are not UTF-8: pika sends it as it is.
        raw.message_id = b"\xff\xfe"
        channel.basic_publish("", dead_letter_queue(queue), b"raw", raw)
    listed = page(rabbit.url, queue)
    assert len(listed.letters) == 7 and len({x.digest for _, x in listed.letters}) == 7
    wanted = {x.digest for _, x in listed.letters if x.error == "E 9"} | {
        x.digest for _, x in listed.letters if x.key in (None, "order-\x002")
    }
    done = move_letters(
        [rabbit.url], "test", None, dead_letter_queue(queue), lambda x: x.digest in wanted
    )
    why = {letter.key: reason for letter, reason in done.left}
    assert why == {"order-3": NO_QUEUE, "order-4": f"{QUEUE_GONE} ({queue}.gone)"}
    assert sorted(str(x.key) for x in done.moved) == ["None", "None", "None", "order-\x002"]
    assert (done.read, done.depth) == (7, 7)
    assert len(drain(rabbit.url, queue, expect=4)) == 4
    purged = move_letters(
        [rabbit.url], "test", None, dead_letter_queue(queue), lambda _: True, publish=False
    )
    assert sorted(str(x.key) for x in purged.moved) == ["order-0", "order-3", "order-4"]
    assert page(rabbit.url, queue).letters == []
