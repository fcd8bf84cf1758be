"""The inbox's copies of a delivery (a retry's, a dead letter's) on the real broker, through
each kind of inbox: a copy keeps nothing the broker refuses or expires; a copy the broker
refuses never loses its delivery; and FastStream publishes a handler's return value once,
after the commit, and nothing for a delivery whose handler did not commit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import uuid
from collections.abc import Callable, Iterator

import pika
import pytest
from faststream import Context
from faststream.exceptions import AckMessage
from faststream.rabbit import RabbitMessage, RabbitQueue

from devtools.broker import drain
from devtools.servers import RabbitNode, wait_until
from relay.broker.aio_consumer import delivery_of
from relay.db.inbox_async import AsyncTransaction
from relay.db.inbox_transaction import Transaction
from relay.inbox import Delivery, InboxSettings, Settings
from relay.inbox.aio import AsyncInbox
from relay.inbox.faststream import TRANSACTION
from tests.support.inbox import (
    Recorder,
    consuming,
    effects,
    inbox_router,
    processed,
    publish,
    recording,
    serve_faststream,
    topology,
    value,
)
from tests.support.inprocess import settings

pytestmark = pytest.mark.databases("postgresql", "sqlite")
PRODUCER = "producer"
# RabbitMQ's frame_max, which a message's properties must fit (its content header's frame).
FRAME_MAX = 131072


@pytest.fixture(scope="module")
def producer(rabbit: RabbitNode) -> str:
    """The URL of another RabbitMQ user than the consumers' (guest)."""
    with contextlib.suppress(Exception):  # made already, by an earlier test of this node
        rabbit.ctl("add_user", PRODUCER, PRODUCER)
    rabbit.ctl("set_permissions", PRODUCER, ".*", ".*", ".*")
    return rabbit.url.replace("guest:guest", f"{PRODUCER}:{PRODUCER}")


def test_a_dead_letter_keeps_nothing_the_broker_would_refuse_or_expire(
    with_effects: str, rabbit: RabbitNode, producer: str, flavour: str
) -> None:
    """The producer set ``user_id`` (itself, another user than the consumer's) and an
    ``expiration``: the copy the consumer publishes has neither (the broker would close the
    consumer's channel on another user's id, and the dead letter would vanish when it
    expired), and keeps the rest."""
    exchange, (queue,), dead = topology(rabbit.url)
    handler, calls = recording(queue, fail=lambda _d: True)
    with consuming(
        with_effects, rabbit.url, queue, handler, flavour, inbox_max_attempts="1"
    ) as consumer:
        properties = pika.BasicProperties(
            message_id="m-1",
            user_id=PRODUCER,
            expiration="600000",
            app_id="billing",
            headers={"tenant": "a"},
            delivery_mode=2,
        )
        with pika.BlockingConnection(pika.URLParameters(producer)) as conn:
            channel = conn.channel()
            channel.confirm_delivery()
            channel.basic_publish(exchange, "", b"{}", properties)
        (letter,) = drain(rabbit.url, dead, 1, timeout=30)
        assert value(consumer, "inbox_failures_total", outcome="dead_lettered") == 1
    assert letter.properties is not None
    assert (letter.properties.user_id, letter.properties.expiration) == (None, None)
    assert (letter.message_id, letter.properties.app_id) == ("m-1", "billing")
    assert (letter.headers or {})["tenant"] == "a"
    assert calls["m-1"] == 1


def test_a_dead_letter_its_queue_refuses_waits_and_the_rest_flow(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """The dead letters' queue at its length limit, refusing publishes (a nack): the poison
    message waits in a retry queue, never dropped, the messages behind it are processed;
    once the queue takes messages again, it is dead-lettered with its reason."""
    exchange, (queue,), dead = topology(rabbit.url)
    policy = f"full-{uuid.uuid4().hex[:8]}"
    full = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    rabbit.ctl("set_policy", "--apply-to", "queues", policy, f"^{dead}$", full)
    handler, calls = recording(queue, fail=lambda d: d.key == "poison")
    quick = {"inbox_max_attempts": "1", "inbox_retry_delay": "0.2", "inbox_retry_delay_max": "0.5"}
    try:
        with consuming(with_effects, rabbit.url, queue, handler, flavour, **quick) as consumer:
            publish(rabbit.url, exchange, [("poison", {}), *[(f"m-{n}", {}) for n in range(5)]])
            wait_until(lambda: value(consumer, "inbox_copies_refused_total") >= 2, 30, "refused")
            wait_until(lambda: value(consumer, "inbox_processed_total") == 5, 30, "the rest")
            rabbit.ctl("clear_policy", policy)
            (letter,) = drain(rabbit.url, dead, 1, timeout=30)
    finally:
        with contextlib.suppress(Exception):
            rabbit.ctl("clear_policy", policy)
    assert letter.message_id == "poison"
    assert (letter.headers or {})["x-inbox-attempts"] == 1
    assert calls["poison"] == 1  # dead-lettered when it came back, not run again
    assert processed(with_effects) == {(queue, f"m-{n}"): 1 for n in range(5)}


class CommitsThenFails(Recorder):
    """Writes its effect, commits it through the driver (past the inbox's guard), then
    raises: dead-lettered at once, its key kept (run again, it would write twice)."""

    def __call__(self, delivery: Delivery, tx: Transaction) -> None:
        result = tx.execute(effects.insert(), self._effect(delivery))
        driver = result.context.root_connection.connection.driver_connection
        assert driver is not None
        driver.commit()
        raise ValueError("failed after committing its part")

    async def aio(self, delivery: Delivery, tx: AsyncTransaction) -> None:
        await tx.execute(effects.insert(), self._effect(delivery))
        driver = (await tx._conn.get_raw_connection()).driver_connection
        assert driver is not None
        await driver.commit()
        raise ValueError("failed after committing its part")


def test_a_dead_letter_with_its_key_kept_that_its_queue_refuses_is_not_lost(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """A part of the handler's work committed past the guard, then it failed: dead-lettered
    at once with its key kept. The dead letters' queue refuses it, so it waits in a retry
    queue; it comes back with its key committed. It was acked there as a duplicate, and the
    dead letter was lost (no operator saw it): now it is dead-lettered, not run again."""
    exchange, (queue,), dead = topology(rabbit.url)
    policy = f"full-{uuid.uuid4().hex[:8]}"
    full = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    rabbit.ctl("set_policy", "--apply-to", "queues", policy, f"^{dead}$", full)
    handler = CommitsThenFails(queue, fail=lambda _d: True)
    quick = {"inbox_retry_delay": "0.2", "inbox_retry_delay_max": "0.5"}
    try:
        with consuming(with_effects, rabbit.url, queue, handler, flavour, **quick) as consumer:
            publish(rabbit.url, exchange, [("m-1", {})])
            wait_until(lambda: value(consumer, "inbox_copies_refused_total") >= 2, 30, "refused")
            rabbit.ctl("clear_policy", policy)
            (letter,) = drain(rabbit.url, dead, 1, timeout=30)
            assert value(consumer, "inbox_duplicates_total") == 0
    finally:
        with contextlib.suppress(Exception):
            rabbit.ctl("clear_policy", policy)
    said = str((letter.headers or {})["x-inbox-error"])
    assert said.startswith("TransactionEnded: the handler committed a part"), said
    assert handler.calls == {"m-1": 1}  # its part once
    assert processed(with_effects) == {(queue, "m-1"): 1}


class CommitsThenDrops(CommitsThenFails):
    """``CommitsThenFails``, the broker's connections closed on its first run (before its
    dead letter is published): the delivery comes again with its key committed."""

    def __init__(self, consumer: str, drop: Callable[[], object]) -> None:
        super().__init__(consumer, fail=lambda _d: True)
        self.drop = drop
        self.dropped = threading.Event()

    def __call__(self, delivery: Delivery, tx: Transaction) -> None:
        if not self.calls:
            self.drop()
            self.dropped.set()
        super().__call__(delivery, tx)

    async def aio(self, delivery: Delivery, tx: AsyncTransaction) -> None:
        if not self.calls:
            await asyncio.to_thread(self.drop)
            self.dropped.set()
        await super().aio(delivery, tx)


def test_a_dead_letter_with_its_key_kept_lost_with_the_broker_is_published_when_it_comes_back(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """The broker's connection is lost before a kept-key dead letter is confirmed (an
    outside review's d3): its delivery comes again, its key committed. It was acked as a
    duplicate, the dead letter never published: now its recorded failure says it was
    dead-lettered, and it is, not run again."""
    exchange, (queue,), dead = topology(rabbit.url)
    handler = CommitsThenDrops(queue, lambda: rabbit.ctl("close_all_connections", "test"))
    with consuming(with_effects, rabbit.url, queue, handler, flavour) as consumer:
        publish(rabbit.url, exchange, [("m-1", {})])
        assert handler.dropped.wait(60), "the broker's connections closed"
        (letter,) = drain(rabbit.url, dead, 1, timeout=60)
        assert value(consumer, "inbox_duplicates_total") == 0
    said = str((letter.headers or {})["x-inbox-error"])
    assert said.startswith("TransactionEnded: the handler committed a part"), said
    assert handler.calls == {"m-1": 1}  # its part once
    assert processed(with_effects) == {(queue, "m-1"): 1}


def test_a_refused_retry_copy_sends_its_delivery_back_uncounted(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """The retry queue refuses the copy (at its length limit): the delivery goes back to its
    queue, uncounted beyond its real failure, the consumer pausing with back-off; once the
    retry queue takes messages, the message goes through its schedule and is processed."""
    exchange, (queue,), _dead = topology(rabbit.url)
    policy = f"full-{uuid.uuid4().hex[:8]}"
    full = json.dumps({"max-length": 0, "overflow": "reject-publish"})
    rabbit.ctl("set_policy", "--apply-to", "queues", policy, f"^{queue}\\.retry\\.", full)
    handler, calls = recording(queue, fail=lambda d: d.key == "m-1" and calls["m-1"] <= 2)
    schedule = {"inbox_max_attempts": "5", "inbox_immediate_retries": "1"}
    try:
        with consuming(
            with_effects, rabbit.url, queue, handler, flavour, inbox_retry_delay="0.2", **schedule
        ) as consumer:
            publish(rabbit.url, exchange, [("m-1", {})])
            wait_until(lambda: value(consumer, "inbox_copies_refused_total") >= 1, 30, "refused")
            rabbit.ctl("clear_policy", policy)
            wait_until(lambda: value(consumer, "inbox_processed_total") == 1, 60, "processed")
    finally:
        with contextlib.suppress(Exception):
            rabbit.ctl("clear_policy", policy)
    assert processed(with_effects) == {(queue, "m-1"): 1}
    assert calls["m-1"] == 3  # two failures, then done: the refusals ran nothing


@contextlib.contextmanager
def faststream_with_a_publisher(
    database_url: str, amqp_url: str, queue: str, target: str
) -> Iterator[AsyncInbox]:
    """A FastStream app whose inbox subscriber returns ``{"done": <key>}`` to ``target``
    (a ``@publisher``), writing its effect in the inbox's transaction."""
    config = InboxSettings.load({}, {"inbox_queue": queue})
    loop = asyncio.new_event_loop()
    inbox = loop.run_until_complete(_inbox(settings(database_url, amqp_url), config))
    stop = loop.run_until_complete(_event())

    async def main() -> None:
        router = inbox_router(inbox)

        @router.subscriber(RabbitQueue(queue, declare=False))
        @router.publisher(target)
        async def handle(
            message: RabbitMessage, tx: AsyncTransaction = Context(TRANSACTION)
        ) -> dict[str, str]:
            delivery = delivery_of(message.raw_message)
            await tx.execute(effects.insert(), {"consumer": queue, "message_id": delivery.key})
            return {"done": str(delivery.key)}

        await serve_faststream(inbox, router, stop)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),))
    thread.start()
    try:
        yield inbox
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()


# How a FastStream handler finishes its message itself -> the runs it takes, processed once.
FINISHED_BY_THE_HANDLER = {
    "acked, then failed, the retry queue taking the copy": 2,
    "acked, then failed, the retry queue refusing the copy": 2,
    "AckMessage raised": 1,
}


@pytest.mark.parametrize("how", FINISHED_BY_THE_HANDLER)
def test_a_faststream_handler_that_finishes_its_message_itself_is_processed_once(
    with_effects: str, rabbit: RabbitNode, how: str
) -> None:
    """The handler acks its message itself (``await message.ack()``) and fails on its first
    run: the inbox's requeue is refused (the message is no longer the channel's to answer),
    and the message was lost, neither retried nor dead-lettered (an outside review,
    review79's d2). A copy of it goes back to the queue in its place: processed once. With
    no immediate retry, its copy goes to a retry queue; that queue refusing it, the copy
    goes to the queue itself (it was lost so too: review82's a3). ``raise AckMessage()``,
    FastStream's way to finish early, was taken for a failure: its work rolled back, the
    message dead-lettered after its attempts (review83's b4); it is done, committed."""
    exchange, (queue,), _dead = topology(rabbit.url)
    config = InboxSettings.load({}, {"inbox_queue": queue, "inbox_immediate_retries": "0"})
    policy = f"full-{uuid.uuid4().hex[:8]}"
    if how.endswith("refusing the copy"):
        full = json.dumps({"max-length": 0, "overflow": "reject-publish"})
        rabbit.ctl("set_policy", "--apply-to", "queues", policy, f"^{queue}\\.retry\\.", full)
    loop = asyncio.new_event_loop()
    inbox = loop.run_until_complete(_inbox(settings(with_effects, rabbit.url), config))
    stop = loop.run_until_complete(_event())
    runs: list[str] = []

    async def main() -> None:
        router = inbox_router(inbox)

        @router.subscriber(RabbitQueue(queue, declare=False))
        async def handle(
            message: RabbitMessage, tx: AsyncTransaction = Context(TRANSACTION)
        ) -> None:
            delivery = delivery_of(message.raw_message)
            runs.append(str(delivery.key))
            await tx.execute(effects.insert(), {"consumer": queue, "message_id": delivery.key})
            if how == "AckMessage raised":
                raise AckMessage()
            await message.ack()
            if len(runs) == 1:
                raise ValueError("failed after acking its message")

        await serve_faststream(inbox, router, stop)

    thread = threading.Thread(target=loop.run_until_complete, args=(main(),))
    thread.start()
    try:
        publish(rabbit.url, exchange, [("m-1", {})])
        wait_until(lambda: value(inbox, "inbox_processed_total") == 1, 30, "processed")
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()
        with contextlib.suppress(Exception):
            rabbit.ctl("clear_policy", policy)
    assert runs == ["m-1"] * FINISHED_BY_THE_HANDLER[how]
    assert processed(with_effects) == {(queue, "m-1"): 1}


async def _inbox(relay_settings: Settings, config: InboxSettings) -> AsyncInbox:
    return AsyncInbox(relay_settings, config)  # its engine made on the loop it runs on


async def _event() -> asyncio.Event:
    return asyncio.Event()


def test_faststream_publishes_a_handlers_return_value_once_after_its_commit(
    with_effects: str, rabbit: RabbitNode
) -> None:
    """The return value reaches the ``@publisher`` target with its body; a duplicate of the
    message (processed before) runs nothing and publishes nothing."""
    exchange, (queue,), _dead = topology(rabbit.url)
    target = f"{queue}.done"
    with pika.BlockingConnection(pika.URLParameters(rabbit.url)) as conn:
        conn.channel().queue_declare(target, durable=True)
    with faststream_with_a_publisher(with_effects, rabbit.url, queue, target) as inbox:
        publish(rabbit.url, exchange, [("m-1", {}), ("m-2", {}), ("m-1", {})])
        wait_until(lambda: value(inbox, "inbox_duplicates_total") == 1, 30, "the duplicate")
        results = drain(rabbit.url, target, 2, timeout=10)
    assert sorted(json.loads(result.body)["done"] for result in results) == ["m-1", "m-2"]
    assert processed(with_effects) == {(queue, "m-1"): 1, (queue, "m-2"): 1}


def test_a_ce_id_too_long_for_a_message_id_is_dead_lettered_and_the_rest_flow(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """A CloudEvent without a message id whose ce-id is 256 bytes: no key the inbox can keep,
    so dead-lettered with its reason (aio-pika's copy made the ce-id its message id, which
    AMQP caps at 255 bytes: the asyncio consumer stopped on it, FastStream dropped it)."""
    exchange, (queue,), dead = topology(rabbit.url)
    handler, _calls = recording(queue)
    with consuming(with_effects, rabbit.url, queue, handler, flavour) as consumer:
        publish(rabbit.url, exchange, [(None, {"ce-id": "e" * 256}), ("m-1", {}), ("m-2", {})])
        (letter,) = drain(rabbit.url, dead, 1, timeout=30)
        wait_until(lambda: value(consumer, "inbox_processed_total") == 2, 30, "the rest")
    assert "256 bytes" in str((letter.headers or {})["x-inbox-error"])
    assert (letter.headers or {})["ce-id"] == "e" * 256
    assert processed(with_effects) == {(queue, "m-1"): 1, (queue, "m-2"): 1}


def test_a_dead_letter_whose_headers_would_not_fit_a_frame_goes_without_its_reasons(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """A message whose own headers come near the frame's size: with the inbox's reasons its
    dead letter's properties would not fit a frame (the broker closed the connection at
    each try, the message stayed for good and held the queue): it goes without them, and
    the messages behind it flow."""
    exchange, (queue,), dead = topology(rabbit.url)
    handler, calls = recording(queue, fail=lambda d: d.key == "big")
    near = {"big": "x" * (FRAME_MAX - 100)}  # fits a frame by some 60 bytes
    with consuming(
        with_effects, rabbit.url, queue, handler, flavour, inbox_max_attempts="1"
    ) as consumer:
        publish(rabbit.url, exchange, [("big", near), ("m-1", {}), ("m-2", {})])
        (letter,) = drain(rabbit.url, dead, 1, timeout=30)
        wait_until(lambda: value(consumer, "inbox_processed_total") == 2, 30, "the rest")
    headers = letter.headers or {}
    assert headers["big"] == near["big"]
    assert "x-inbox-error" not in headers
    assert calls["big"] == 1
