"""The inbox (``relay.inbox``) in-process against the real broker and real databases: every
message processed once however often it comes, a poison message dead-lettered after its
attempts, a message without an id dead-lettered unprocessed, consumers of one database each
processing every message once under their own names."""

from __future__ import annotations

import collections
import contextlib
import functools
import inspect
import threading
from collections.abc import Mapping
from datetime import UTC, datetime

import pika
import pytest
import sqlalchemy as sa

from devtools.broker import drain
from devtools.servers import RabbitNode, wait_until
from relay.cli import main
from relay.db.engine import create_engine
from relay.db.inbox_async import AsyncTransaction
from relay.db.inbox_transaction import Transaction, TransactionEnded
from relay.inbox import Delivery, Handler, Inbox, InboxSettings
from tests.support import inbox_script
from tests.support.inbox import (
    AnyInbox,
    Recorder,
    at_least,
    attempts,
    consuming,
    copies,
    effects,
    processed,
    publish,
    recording,
    topology,
    value,
    waiting,
)
from tests.support.inprocess import settings


def test_every_message_is_processed_once_however_often_it_comes(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    exchange, (queue,), _dead = topology(rabbit.url)
    ids = [f"m-{n}" for n in range(50)]
    # Each twice, and a CloudEvent keyed by its ce-id, three times.
    keyed: list[str | None] = [*ids, *ids]
    headers: list[dict[str, str]] = [{}] * len(keyed) + [{"ce-id": "event-1"}] * 3
    messages = list(zip([*keyed, None, None, None], headers, strict=True))
    handler, calls = recording(queue)
    with consuming(with_effects, rabbit.url, queue, handler, flavour) as consumer:
        publish(rabbit.url, exchange, messages)
        wait_until(lambda: value(consumer, "inbox_duplicates_total") >= 52, 30, "duplicates")
    expected = {(queue, key): 1 for key in [*ids, "event-1"]}
    assert processed(with_effects) == expected
    assert set(calls.values()) == {1}
    assert value(consumer, "inbox_processed_total") == 51
    assert drain(rabbit.url, queue, 0, timeout=1) == []  # every delivery was acked


@pytest.mark.databases("postgresql", "sqlite")
def test_a_poison_message_is_dead_lettered_after_its_attempts_and_the_rest_flow(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    exchange, (queue,), dead = topology(rabbit.url)
    ids = [f"m-{n}" for n in range(20)]
    handler, calls = recording(queue, fail=lambda d: d.key == "poison")
    quick = {"inbox_max_attempts": "3", "inbox_retry_delay": "0.2"}
    with consuming(with_effects, rabbit.url, queue, handler, flavour, **quick) as consumer:
        publish(rabbit.url, exchange, [(i, {}) for i in ids[:10]])
        publish(rabbit.url, exchange, [("poison", {})])
        publish(rabbit.url, exchange, [(i, {}) for i in ids[10:]])
        dead_lettered = drain(rabbit.url, dead, 1, timeout=30)
        wait_until(lambda: value(consumer, "inbox_processed_total") == 20, 30, "the others")
        assert attempts(with_effects, queue, "poison") == 3
    assert [d.message_id for d in dead_lettered] == ["poison"]
    assert calls["poison"] == 3
    assert processed(with_effects) == {(queue, i): 1 for i in ids}  # its writes rolled back
    assert value(consumer, "inbox_failures_total", outcome="retried") == 2
    assert value(consumer, "inbox_failures_total", outcome="dead_lettered") == 1
    headers = dead_lettered[0].headers or {}
    said = {k: headers[k] for k in ("x-inbox-attempts", "x-inbox-consumer")}
    assert said == {"x-inbox-attempts": 3, "x-inbox-consumer": queue}
    # Its type and where it was raised; its message may quote a payload: not kept.
    assert str(headers["x-inbox-error"]).startswith("ValueError at tests.support.inbox:")
    assert headers["x-inbox-queue"] == queue
    first, last = (
        datetime.fromisoformat(str(headers[f"x-inbox-{n}-failure"])) for n in ("first", "last")
    )
    assert first <= last <= datetime.now(UTC)


@pytest.mark.databases("postgresql")
def test_a_message_without_an_id_is_dead_lettered_unprocessed(
    with_effects: str, rabbit: RabbitNode
) -> None:
    exchange, (queue,), dead = topology(rabbit.url)
    handler, calls = recording(queue)
    with consuming(with_effects, rabbit.url, queue, handler):
        publish(rabbit.url, exchange, [(None, {"tenant": "a"}), ("m-1", {})])
        dead_lettered = drain(rabbit.url, dead, 1, timeout=30)
        wait_until(lambda: calls["m-1"] == 1, 30, "the message with an id")
    (delivered,) = dead_lettered
    assert delivered.message_id is None and delivered.headers is not None
    assert delivered.headers["tenant"] == "a"
    assert "neither a message_id nor a ce-id" in str(delivered.headers["x-inbox-error"])
    assert delivered.headers["x-inbox-attempts"] == 0
    assert processed(with_effects) == {(queue, "m-1"): 1}


@pytest.mark.databases("postgresql", "mariadb")
def test_consumers_of_one_database_each_process_every_message_once(
    with_effects: str, rabbit: RabbitNode
) -> None:
    exchange, queues, _dead = topology(rabbit.url, queues=2)
    ids = [f"m-{n}" for n in range(30)]
    billing, billing_calls = recording("billing")
    audit, audit_calls = recording("audit")
    with (
        consuming(with_effects, rabbit.url, queues[0], billing, inbox_consumer="billing") as one,
        consuming(with_effects, rabbit.url, queues[1], audit, inbox_consumer="audit") as other,
    ):
        publish(rabbit.url, exchange, [(i, {}) for i in ids] * 2)
        for consumer in (one, other):
            wait_until(functools.partial(copies, consumer, 30), 30, "every copy")
    assert processed(with_effects) == {(c, i): 1 for c in ("billing", "audit") for i in ids}
    assert set(billing_calls.values()) == set(audit_calls.values()) == {1}


class Died(BaseException):
    """Stands in for a consumer that dies inside its handler (a SIGKILL, an OOM kill): no
    ``except Exception`` sees it, and the consumer's connection goes with it."""


def run_until_dead(database_url: str, amqp_url: str, queue: str, handler: Handler) -> None:
    """A consumer until its handler dies (its thread ends; unacked deliveries go back)."""
    config = InboxSettings.load({}, {"inbox_queue": queue, "inbox_max_attempts": "2"})
    consumer = Inbox(settings(database_url, amqp_url, backoff_initial=0.05), config)
    stop = threading.Event()
    died: list[BaseException] = []

    def run() -> None:
        try:
            consumer.run(handler, stop)
        except Died as exc:
            died.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(20)
    stop.set()
    thread.join(10)
    assert not thread.is_alive()


@pytest.mark.databases("postgresql", "sqlite")
def test_a_handler_that_kills_its_consumer_is_dead_lettered_after_its_attempts(
    with_effects: str, rabbit: RabbitNode
) -> None:
    """Never seen to fail, only to come back: a run found marked by the next delivery died
    inside the handler and counts. The first delivery's run is not marked (it costs a
    first delivery nothing), so with two attempts allowed the fourth delivery is the dead
    letter: runs 2 and 3 counted."""
    exchange, (queue,), dead = topology(rabbit.url)
    runs: collections.Counter[str] = collections.Counter()

    def handler(delivery: Delivery, _tx: Transaction) -> None:
        runs[delivery.key or ""] += 1
        raise Died

    publish(rabbit.url, exchange, [("killer", {})])
    for _ in range(3):
        run_until_dead(with_effects, rabbit.url, queue, handler)
    assert runs["killer"] == 3
    with consuming(with_effects, rabbit.url, queue, handler, inbox_max_attempts="2"):
        dead_lettered = drain(rabbit.url, dead, 1, timeout=30)
    assert [d.message_id for d in dead_lettered] == ["killer"]
    assert runs["killer"] == 3, "dead-lettered without a fourth run"


def test_consumers_stopped_between_messages_charge_no_attempt(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """Stopped and started again five times in a stream: the deliveries each had prefetched
    come again (redelivered), and none is charged, since none failed."""
    exchange, (queue,), _dead = topology(rabbit.url)
    ids = [f"m-{n}" for n in range(300)]
    handler, calls = recording(queue)
    publish(rabbit.url, exchange, [(i, {}) for i in ids])
    for round_ in range(5):
        with consuming(with_effects, rabbit.url, queue, handler, flavour, inbox_prefetch="50"):
            wait_until(functools.partial(at_least, calls, 50 * (round_ + 1)), 30, "some")
    with consuming(with_effects, rabbit.url, queue, handler, flavour) as last:
        wait_until(lambda: len(calls) == len(ids), 30, "every message")
        assert value(last, "inbox_failures_total", outcome="retried") == 0
    assert processed(with_effects) == {(queue, i): 1 for i in ids}
    engine = create_engine(with_effects)
    with engine.connect() as conn:
        charged = conn.scalar(sa.text("SELECT count(*) FROM inbox_attempts WHERE attempts > 0"))
    engine.dispose()
    assert charged == 0


class CommitsEarly(Recorder):
    """Writes a part, commits it (by SQL text: there is no ``commit`` to call) on its first
    try of each message, and writes the rest."""

    def __call__(self, delivery: Delivery, tx: Transaction) -> None:
        effect = self._effect(delivery)
        tx.execute(effects.insert(), effect)
        if self.calls[effect["message_id"]] == 1:
            tx.execute(sa.text("COMMIT"))
        tx.execute(effects.insert(), {**effect, "consumer": "after"})

    async def aio(self, delivery: Delivery, tx: AsyncTransaction) -> None:
        effect = self._effect(delivery)
        await tx.execute(effects.insert(), effect)
        if self.calls[effect["message_id"]] == 1:
            await tx.execute(sa.text("COMMIT"))
        await tx.execute(effects.insert(), {**effect, "consumer": "after"})


@pytest.mark.databases("postgresql", "mariadb", "sqlite")
def test_a_handler_that_commits_early_fails_and_its_work_is_done_once(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """It wrote a part, committed (by SQL text: there is no ``commit`` to call), and would
    write the rest: the attempt fails, nothing of it stays, and the retry does all of it."""
    exchange, (queue,), _dead = topology(rabbit.url)
    handler = CommitsEarly("before", fail=lambda _d: False)
    with consuming(with_effects, rabbit.url, queue, handler, flavour) as consumer:
        publish(rabbit.url, exchange, [("m-1", {}), ("m-2", {})])
        wait_until(lambda: value(consumer, "inbox_processed_total") == 2, 30, "both processed")
        assert value(consumer, "inbox_failures_total", outcome="retried") == 2
    tried = handler.calls
    assert tried == {"m-1": 2, "m-2": 2}
    expected = {(part, m): 1 for part in ("before", "after") for m in ("m-1", "m-2")}
    assert processed(with_effects) == expected


# The driver's doors, past the guard: its connection's commit, or a cursor's COMMIT.
DRIVER_DOORS = ("the driver's commit", "a driver cursor's COMMIT")


class ThroughDoors(Recorder):
    """On its first run of a message, writes its effect and goes through the door the
    message's key names: one of SQLAlchemy's (``inbox_script.DOORS``; the guard's refusal
    caught, as a handler that catches every error would), or one of the driver's
    (``DRIVER_DOORS``), then raises; its runs after that write and return."""

    def __call__(self, delivery: Delivery, tx: Transaction) -> None:
        effect = self._effect(delivery)
        result = tx.execute(effects.insert(), effect)
        door = effect["message_id"]
        if self.calls[door] > 1:
            return
        conn = result.context.root_connection
        if door not in DRIVER_DOORS:
            with contextlib.suppress(TransactionEnded):
                inbox_script.through(conn, door)
            return
        driver = conn.connection.driver_connection
        assert driver is not None
        if door == DRIVER_DOORS[0]:
            driver.commit()
        else:
            driver.cursor().execute("COMMIT")
        raise ValueError("failed after committing its part")

    async def aio(self, delivery: Delivery, tx: AsyncTransaction) -> None:
        effect = self._effect(delivery)
        await tx.execute(effects.insert(), effect)
        door = effect["message_id"]
        if self.calls[door] > 1:
            return
        if door not in DRIVER_DOORS:
            with contextlib.suppress(TransactionEnded):
                await inbox_script.through_async(tx._conn, door)
            return
        driver = (await tx._conn.get_raw_connection()).driver_connection
        assert driver is not None
        if door == DRIVER_DOORS[0]:
            await driver.commit()
        else:
            cursor = driver.cursor()
            await (await cursor if inspect.isawaitable(cursor) else cursor).execute("COMMIT")
        raise ValueError("failed after committing its part")


def test_every_door_a_handler_may_try_leaves_its_effects_once(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """Through the handler's own API, at each front end on each database: each of
    SQLAlchemy's doors is refused (the run failed though the handler caught it, nothing
    committed) and the retry processes the message once; a part committed through the
    driver and then failed is dead-lettered at once (never run again: that part once),
    naming why."""
    exchange, (queue,), dead = topology(rabbit.url)
    doors = list(inbox_script.DOORS)
    handler = ThroughDoors(queue, fail=lambda _d: False)
    quick = {"inbox_max_attempts": "3", "inbox_retry_delay": "0.1"}
    with consuming(with_effects, rabbit.url, queue, handler, flavour, **quick) as consumer:
        publish(rabbit.url, exchange, [(door, {}) for door in [*doors, *DRIVER_DOORS]])
        letters = drain(rabbit.url, dead, len(DRIVER_DOORS), timeout=30)
        done = functools.partial(copies_processed, consumer, len(doors))
        wait_until(done, 30, "every SQLAlchemy door's message processed")
        assert value(consumer, "inbox_failures_total", outcome="retried") == len(doors)
    assert processed(with_effects) == {(queue, door): 1 for door in [*doors, *DRIVER_DOORS]}
    assert handler.calls == {**{door: 2 for door in doors}, **dict.fromkeys(DRIVER_DOORS, 1)}
    for door in doors:
        assert attempts(with_effects, queue, door) == 1
    assert sorted(letter.message_id or "" for letter in letters) == sorted(DRIVER_DOORS)
    for letter in letters:
        said = str((letter.headers or {})["x-inbox-error"])
        assert said.startswith("TransactionEnded: the handler committed a part"), said
        assert "ValueError" in said


class CommitsThenExits(Recorder):
    """Writes its effect, commits it through the driver, then calls ``sys.exit``."""

    def __call__(self, delivery: Delivery, tx: Transaction) -> None:
        result = tx.execute(effects.insert(), self._effect(delivery))
        driver = result.context.root_connection.connection.driver_connection
        assert driver is not None
        driver.commit()
        raise SystemExit(3)

    async def aio(self, delivery: Delivery, tx: AsyncTransaction) -> None:
        await tx.execute(effects.insert(), self._effect(delivery))
        driver = (await tx._conn.get_raw_connection()).driver_connection
        assert driver is not None
        await driver.commit()
        raise SystemExit(3)


def test_a_handler_that_exits_after_committing_a_part_is_dead_lettered_then_exits(
    with_effects: str, rabbit: RabbitNode, flavour: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``sys.exit`` in a handler (a ``SystemExit``, not an error) after a part of its work
    committed past ``tx``: dead-lettered at once, its key kept, the delivery acked, and then
    the consumer exits with it (the front end's own way: FastStream stops the subscriber).
    It left the inbox unlooked at: no dead letter, and the delivery that came again was
    acked as a duplicate with that part alone done."""
    exchange, (queue,), dead = topology(rabbit.url)
    handler = CommitsThenExits(queue, fail=lambda _d: False)
    exits: list[type[BaseException]] = []  # what ended the consumer's thread
    monkeypatch.setattr(threading, "excepthook", lambda args: exits.append(args.exc_type))
    with consuming(with_effects, rabbit.url, queue, handler, flavour):
        publish(rabbit.url, exchange, [("m-1", {})])
        (letter,) = drain(rabbit.url, dead, 1, timeout=30)
        if flavour != "faststream":
            wait_until(lambda: bool(exits), 30, "the consumer's exit")
    # FastStream takes a handler's SystemExit itself: it stops the subscriber (and its app).
    assert exits == ([] if flavour == "faststream" else [SystemExit])
    said = str((letter.headers or {})["x-inbox-error"])
    assert said.startswith("TransactionEnded: the handler committed a part"), said
    assert "SystemExit" in said
    assert waiting(rabbit.url, queue) == 0  # acked before the consumer exited
    assert processed(with_effects) == {(queue, "m-1"): 1}
    assert handler.calls == {"m-1": 1}


def copies_processed(consumer: AnyInbox, count: int) -> bool:
    return value(consumer, "inbox_processed_total") == count


@pytest.mark.databases("postgresql", "mariadb", "sqlite")
def test_hostile_message_ids_are_dead_lettered_with_a_reason_and_the_consumer_lives(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """Ids a broker carries and no database keeps alike: bytes that are not UTF-8 (pika
    hands them over as bytes), a NUL, a ce-id of 256 bytes, an empty id with an empty ce-id. The
    consumer exited on the first (a stuck queue) and requeued the second forever."""
    exchange, (queue,), dead = topology(rabbit.url)
    handler, calls = recording(queue)
    hostile: list[tuple[str | bytes | None, Mapping[str, str]]] = [
        (b"\xffm-1", {}),
        ("m\x00-2", {}),
        (None, {"ce-id": "e" * 256}),  # AMQP carries no message id over 255 bytes
        ("", {"ce-id": ""}),
    ]
    good = [f"g-{n}" for n in range(10)]
    with consuming(with_effects, rabbit.url, queue, handler, flavour) as consumer:
        publish(rabbit.url, exchange, [*hostile, *[(g, {}) for g in good]])
        dead_lettered = drain(rabbit.url, dead, len(hostile), timeout=30)
        wait_until(lambda: value(consumer, "inbox_processed_total") == len(good), 30, "the good")
    assert len(dead_lettered) == len(hostile)
    kept: set[object] = {d.message_id for d in dead_lettered}  # pika: bytes when not UTF-8
    assert b"\xffm-1" in kept, "the dead letter keeps its id"
    assert processed(with_effects) == {(queue, g): 1 for g in good}
    assert set(calls) == set(good)


@pytest.mark.databases("postgresql", "sqlite")
def test_a_handler_failing_its_first_attempts_goes_through_every_retry_queue_once(
    with_effects: str, rabbit: RabbitNode, flavour: str
) -> None:
    """Its downstream refuses each message's first four attempts: one retry at once, then
    the broker holds it for 0.5, 1 and 2 s (a retry queue each, the copy dead-lettered back
    when it expires), and the fifth of its six attempts goes through. The path is forced by
    the attempts, not hoped for from the clock: a downstream away for a while (3 s) let a
    busy machine's slow attempts outlast it, and some retry queues were never used."""
    exchange, (queue,), dead = topology(rabbit.url)
    ids = [f"m-{n}" for n in range(40)]
    refused = 4
    came_from: dict[str, list[str]] = collections.defaultdict(list)

    def downstream_away(delivery: Delivery) -> bool:
        key = delivery.key or ""
        came_from[key].append(expired_from(delivery.headers))
        return len(came_from[key]) <= refused

    handler, calls = recording(queue, fail=downstream_away)
    schedule = {
        "inbox_max_attempts": "6",
        "inbox_immediate_retries": "1",
        "inbox_retry_delay": "0.5",
        "inbox_retry_delay_max": "2",
    }
    with consuming(with_effects, rabbit.url, queue, handler, flavour, **schedule) as consumer:
        publish(rabbit.url, exchange, [(i, {}) for i in ids])
        wait_until(lambda: value(consumer, "inbox_processed_total") == len(ids), 60, "all")
        assert value(consumer, "inbox_failures_total", outcome="dead_lettered") == 0
        assert value(consumer, "inbox_failures_total", outcome="retried") == refused * len(ids)
    assert drain(rabbit.url, dead, 0, timeout=1) == []
    assert processed(with_effects) == {(queue, i): 1 for i in ids}
    assert calls == {i: refused + 1 for i in ids}
    # Each attempt came from where the one before sent it: the queue, at once, then each
    # retry queue in turn, when the broker expired it there.
    retry_queues = [f"{queue}.retry.{ttl}ms" for ttl in (500, 1000, 2000)]
    assert {i: came_from[i] for i in ids} == {i: ["", "", *retry_queues] for i in ids}
    with pika.BlockingConnection(pika.URLParameters(rabbit.url)) as conn:
        for name in retry_queues:  # empty again
            assert conn.channel().queue_declare(name, passive=True).method.message_count == 0


def expired_from(headers: Mapping[str, object]) -> str:
    """The queue a delivery was last dead-lettered from for expiring (its ``x-death``, the
    broker's own record, latest first), or "" when it never was."""
    deaths = headers.get("x-death")
    if not isinstance(deaths, list) or not deaths:
        return ""
    latest = deaths[0]
    assert isinstance(latest, Mapping) and latest.get("reason") in ("expired", b"expired")
    where = latest["queue"]
    return where.decode() if isinstance(where, bytes) else str(where)


@pytest.mark.databases("postgresql", "sqlite")
def test_dead_letters_are_listed_by_reason_and_moved_back_once_the_cause_is_fixed(
    with_effects: str, rabbit: RabbitNode, capsys: pytest.CaptureFixture[str], flavour: str
) -> None:
    """``relay inbox list`` and ``relay inbox requeue`` (a dry run first, then by id): the
    letter goes back to its queue with its attempts forgotten, and the fixed handler
    processes it once; the other letter stays."""
    exchange, (queue,), dead = topology(rabbit.url)
    broken = {"yes"}
    handler, calls = recording(queue, fail=lambda d: bool(broken) and d.key in ("a", "b"))
    quick = {"inbox_max_attempts": "2", "inbox_retry_delay": "0.1"}
    environ = {"RELAY_DATABASE_URL": with_effects, "RELAY_AMQP_URL": rabbit.url}

    def relay(*argv: str) -> str:
        assert main(["inbox", *argv, "--queue", queue], environ) == 0
        return capsys.readouterr().out

    with consuming(with_effects, rabbit.url, queue, handler, flavour, **quick) as consumer:
        publish(rabbit.url, exchange, [("a", {}), ("b", {})])
        wait_until(lambda: waiting(rabbit.url, dead) == 2, 30, "both dead-lettered")
        listed = relay("list")
        assert "2 dead letters" in listed and "ValueError at tests.support.inbox" in listed
        assert "would move 1 " in relay("requeue", "--id", "a", "--dry-run")
        assert attempts(with_effects, queue, "a") == 2
        broken.clear()
        assert "moved 1 " in relay("requeue", "--id", "a", "--reason", "ValueError")
        wait_until(lambda: value(consumer, "inbox_processed_total") == 1, 30, "a processed")
    assert processed(with_effects) == {(queue, "a"): 1}
    assert calls["a"] == 3
    (left,) = drain(rabbit.url, dead, 1, timeout=5)
    assert left.message_id == "b"


@pytest.mark.databases("postgresql", "sqlite")
def test_a_requeued_letter_has_its_whole_schedule_again_whatever_its_key(
    with_effects: str, rabbit: RabbitNode, capsys: pytest.CaptureFixture[str], flavour: str
) -> None:
    """Requeued while its cause is not fixed yet, a letter fails through its whole schedule
    again (its attempts forgotten before it moves, not after: it could fail first), and one
    keyed by its ce-id is chosen and forgotten by that key."""
    exchange, (queue,), dead = topology(rabbit.url)
    handler, calls = recording(queue, fail=lambda _d: True)
    quick = {"inbox_max_attempts": "2", "inbox_retry_delay": "0.1"}
    environ = {"RELAY_DATABASE_URL": with_effects, "RELAY_AMQP_URL": rabbit.url}
    with consuming(with_effects, rabbit.url, queue, handler, flavour, **quick) as consumer:
        publish(rabbit.url, exchange, [("a", {}), (None, {"ce-id": "event-1"})])
        wait_until(lambda: waiting(rabbit.url, dead) == 2, 30, "both dead-lettered")
        for key in ("a", "event-1"):
            assert main(["inbox", "requeue", "--id", key, "--queue", queue], environ) == 0
            assert "moved 1 " in capsys.readouterr().out
        wait_until(lambda: waiting(rabbit.url, dead) == 2, 30, "both dead-lettered again")
        assert value(consumer, "inbox_failures_total", outcome="dead_lettered") == 4
    assert (calls["a"], calls["event-1"]) == (4, 4)
    letters = drain(rabbit.url, dead, 2, timeout=5)
    assert sorted((letter.headers or {})["x-inbox-attempts"] for letter in letters) == [2, 2]


@pytest.mark.databases("sqlite")
def test_listing_a_dead_letter_queue_that_counts_deliveries_says_what_it_costs(
    with_effects: str, rabbit: RabbitNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dead-letter queue declared a quorum queue with a delivery limit: each read of
    ``relay inbox list`` spends a delivery (the broker gives no other way to read a queue),
    and at the limit the broker drops the letter: the listing says so."""
    exchange, (queue,), dead = topology(rabbit.url)
    with pika.BlockingConnection(pika.URLParameters(rabbit.url)) as conn:
        channel = conn.channel()
        channel.queue_delete(dead)
        arguments = {"x-queue-type": "quorum", "x-delivery-limit": 100}
        channel.queue_declare(dead, durable=True, arguments=arguments)
    handler, _calls = recording(queue, fail=lambda _d: True)
    environ = {"RELAY_DATABASE_URL": with_effects, "RELAY_AMQP_URL": rabbit.url}
    with consuming(with_effects, rabbit.url, queue, handler, inbox_max_attempts="1"):
        publish(rabbit.url, exchange, [("a", {})])
        wait_until(lambda: waiting(rabbit.url, dead) == 1, 30, "dead-lettered")
    outputs = []
    for _ in range(2):
        assert main(["inbox", "list", "--queue", queue], environ) == 0
        outputs.append(capsys.readouterr().out)
    assert "1 dead letters" in outputs[0] and "warning" not in outputs[0]
    assert "warning: this queue counts deliveries" in outputs[1]
