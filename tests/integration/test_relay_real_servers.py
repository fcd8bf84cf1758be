"""The relay against a real RabbitMQ node and real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
from decimal import Decimal
from pathlib import Path

import pytest

from devtools.broker import drain, names, simple_topology
from devtools.outbox import insert
from devtools.servers import PostgresServer, RabbitNode
from relay.broker.topology import Exchange, Topology
from relay.buckets import bucket_of
from relay.constants import BUCKET_SPAN_ROWS, OUTBOX_BUCKETS
from relay.db.claims import ClaimStore
from relay.db.migrate import migrate
from relay.db.outbox import OutboxWriter
from relay.lease import watch_period
from relay.records import NewMessage
from tests.support.inprocess import (
    Parts,
    Running,
    enqueue,
    logged,
    rows_by_status,
    settings,
    table,
    wait_for,
)
from tests.support.metrics import sample_value


def test_rows_are_relayed_with_their_properties_and_marked_sent(
    database_url: str, rabbit: RabbitNode
) -> None:
    exchange, queue = names("props")
    messages = [
        NewMessage(
            json.dumps({"order": i}).encode(),
            exchange,
            f"order.{i}",
            "application/json",
            json.dumps({"tenant": "t1", "n": i, "ratio": 0.5}),
        )
        for i in range(50)
    ] + [NewMessage(b"\x00\xffraw", exchange, "raw", "application/octet-stream", None, "fixed-id")]

    async def scenario() -> None:
        async with Running(
            settings(database_url, rabbit.url), simple_topology(exchange, queue)
        ) as parts:
            ids = enqueue(parts, messages)
            # The metrics count a settle after its commit: wait for both.
            await wait_for(
                lambda: (
                    rows_by_status(parts) == {"sent": 51}
                    and sample_value(parts.metrics, "relay_outcomes_total", outcome="acked") == 51
                ),
                30,
                "all rows sent and counted as acked",
            )
            assert ids[-1] == "fixed-id"
            assert table(parts) == [], "acked rows left the outbox for the sent log"

    asyncio.run(scenario())
    got = {d.message_id: d for d in drain(rabbit.url, queue, expect=51)}
    assert len(got) == 51
    raw = got["fixed-id"]
    assert (raw.body, raw.routing_key, raw.content_type, raw.headers) == (
        b"\x00\xffraw",
        "raw",
        "application/octet-stream",
        None,
    )
    sample = next(d for d in got.values() if d.routing_key == "order.7")
    assert json.loads(sample.body) == {"order": 7}
    assert sample.content_type == "application/json"
    assert sample.headers == {"tenant": "t1", "n": 7, "ratio": Decimal("0.5")}
    assert sample.delivery_mode == 2


def test_nacked_rows_are_retried_then_parked(database_url: str, rabbit: RabbitNode) -> None:
    exchange, queue = names("nack")
    # A queue that holds one message and refuses more: RabbitMQ nacks the rest.
    topology = simple_topology(exchange, queue, {"x-max-length": 1, "x-overflow": "reject-publish"})

    async def scenario() -> None:
        async with Running(settings(database_url, rabbit.url, max_attempts=3), topology) as parts:
            enqueue(parts, [NewMessage(b"m", exchange, "k") for _ in range(3)])
            # The metrics count a settle after its commit: wait for both.
            await wait_for(
                lambda: (
                    rows_by_status(parts) == {"sent": 1, "parked": 2}
                    and sample_value(parts.metrics, "relay_outcomes_total", outcome="nacked") == 6
                ),
                30,
                "one row sent, two parked, six nacks counted",
            )
            parked = [r for r in table(parts) if r.status == "parked"]
            assert all(r.attempts == 3 and r.last_error.startswith("nacked") for r in parked)
            assert sample_value(parts.metrics, "relay_republished_total") == 4

    asyncio.run(scenario())
    assert len(drain(rabbit.url, queue, expect=1)) == 1


def test_unroutable_row_is_returned_not_sent(database_url: str, rabbit: RabbitNode) -> None:
    exchange, _ = names("unroutable")
    topology = Topology(exchanges=(Exchange(exchange, type="direct"),))  # no binding at all

    async def scenario() -> None:
        async with Running(settings(database_url, rabbit.url, max_attempts=2), topology) as parts:
            enqueue(parts, [NewMessage(b"m", exchange, "nowhere")])
            await wait_for(lambda: rows_by_status(parts) == {"parked": 1}, 30, "row parked")
            (row,) = table(parts)
            assert row.sent_at is None and row.attempts == 2
            assert row.last_error.startswith("returned: basic.return 312 NO_ROUTE")

    asyncio.run(scenario())


def test_missing_exchange_parks_its_rows_and_others_keep_flowing(
    database_url: str, rabbit: RabbitNode
) -> None:
    exchange, queue = names("good")

    async def scenario() -> None:
        config = settings(database_url, rabbit.url, max_attempts=2)
        async with Running(config, simple_topology(exchange, queue)) as parts:
            enqueue(
                parts,
                [NewMessage(b"bad", "no-such-exchange", "k")]
                + [NewMessage(b"good", exchange, "k") for _ in range(20)],
            )
            await wait_for(
                lambda: rows_by_status(parts) == {"sent": 20, "parked": 1},
                30,
                "good rows sent, the bad one parked",
            )
            bad = next(r for r in table(parts) if r.status == "parked")
            assert "404" in bad.last_error and "no-such-exchange" in bad.last_error

    asyncio.run(scenario())
    assert len(drain(rabbit.url, queue, expect=20)) >= 20


@pytest.mark.databases("sqlite", "postgresql")
def test_confirm_timeout_while_broker_frozen_leads_to_republish(
    database_url: str, rabbit: RabbitNode
) -> None:
    exchange, queue = names("frozen")
    config = settings(database_url, rabbit.url, confirm_timeout=1, lease=10)

    async def scenario() -> None:
        async with Running(config, simple_topology(exchange, queue)) as parts:
            await wait_for(parts.relay.ready, 30, "relay connected")
            rabbit.signal(signal.SIGSTOP)
            try:
                enqueue(parts, [NewMessage(f"{i}".encode(), exchange, "k") for i in range(20)])
                await wait_for(
                    lambda: (
                        sample_value(parts.metrics, "relay_outcomes_total", outcome="timed_out")
                        >= 20
                    ),
                    20,
                    "confirms to time out",
                )
                assert "sent" not in rows_by_status(parts)
            finally:
                rabbit.signal(signal.SIGCONT)
            await wait_for(lambda: rows_by_status(parts) == {"sent": 20}, 30, "all rows sent")
            assert sample_value(parts.metrics, "relay_republished_total") >= 20
            assert all(r.attempts >= 1 for r in table(parts))

    asyncio.run(scenario())
    delivered = drain(rabbit.url, queue, expect=20)
    assert {d.body for d in delivered} == {f"{i}".encode() for i in range(20)}


@pytest.mark.databases("sqlite", "postgresql")
def test_broker_restart_mid_stream_reconnects_and_delivers_every_row(
    database_url: str, rabbit: RabbitNode
) -> None:
    exchange, queue = names("restart")
    total = 3000

    async def scenario() -> None:
        config = settings(database_url, rabbit.url, batch_size=100, window=200)
        async with Running(config, simple_topology(exchange, queue)) as parts:
            enqueue(parts, [NewMessage(f"{i}".encode(), exchange, "k") for i in range(1000)])
            await wait_for(
                lambda: rows_by_status(parts).get("sent", 0) >= 300, 60, "some rows sent"
            )
            await asyncio.to_thread(rabbit.stop)
            # Writers go on while the broker is down: these rows need the reconnect.
            enqueue(parts, [NewMessage(f"{i}".encode(), exchange, "k") for i in range(1000, total)])
            await asyncio.to_thread(rabbit.start)
            await wait_for(lambda: rows_by_status(parts) == {"sent": total}, 120, "all rows sent")
            assert sample_value(parts.metrics, "relay_broker_connections_total") >= 2, (
                "never reconnected"
            )

    asyncio.run(scenario())
    delivered = drain(rabbit.url, queue, expect=total, timeout=60)
    assert {d.body for d in delivered} == {f"{i}".encode() for i in range(total)}


def test_concurrent_claims_on_postgresql_never_overlap(postgresql_url: str) -> None:
    stores = [ClaimStore(postgresql_url, f"relay-{i}", 60) for i in range(3)]
    # Three rounds of turns share the buckets out: the first relay up takes them all and
    # gives up what is beyond its share at its next turn; the others take those.
    for _ in range(3):
        for store in stores:
            store.turn()
    # Rows in every bucket (ids set by hand: a fresh sequence would fill bucket 0 first).
    span = BUCKET_SPAN_ROWS
    ids = [(i % OUTBOX_BUCKETS) * span + i // OUTBOX_BUCKETS + 1 for i in range(3000)]
    insert(postgresql_url, [{"id": i, "message_id": f"m-{i}", "payload": b"x"} for i in ids])
    claimed: list[list[int]] = [[] for _ in stores]

    def worker(i: int) -> None:
        while rows := stores[i].claim(50, 2**62):
            claimed[i].extend(r.id for r in rows)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    every = [id for ids in claimed for id in ids]
    assert len(every) == 3000 == len(set(every))
    assert all(claimed), "a relay claimed nothing: the buckets were not shared out"
    buckets = [{bucket_of(i) for i in ids} for ids in claimed]
    assert not (buckets[0] & buckets[1] or buckets[0] & buckets[2] or buckets[1] & buckets[2])
    for s in stores:
        s.close()


def test_relay_started_while_broker_and_database_are_down_delivers_once_they_are_up(
    tmp_path: Path, rabbit: RabbitNode, caplog: pytest.LogCaptureFixture
) -> None:
    exchange, queue = names("late")
    database = PostgresServer(tmp_path / "pg", tuned_for_tests=True)
    database.start()
    database.psql("CREATE DATABASE outbox")
    url = database.url("outbox")
    migrate(url)
    writer = OutboxWriter(url)
    writer.enqueue([NewMessage(f"{i}".encode(), exchange, "k") for i in range(50)])
    writer.close()
    database.stop()
    rabbit.stop()

    async def scenario() -> None:
        async with Running(settings(url, rabbit.url), simple_topology(exchange, queue)) as parts:
            # It has tried both, and both failed it: it has had its chance to call itself ready.
            await wait_for(
                lambda: (
                    len(logged(caplog, "broker_retry")) > 0
                    and sample_value(parts.metrics, "relay_database_errors_total") > 0
                ),
                30,
                "a connect to the broker and a call to the database to fail",
            )
            assert not parts.relay.ready()
            await asyncio.to_thread(rabbit.start)
            assert sample_value(parts.metrics, "relay_database_connected") == 0
            await asyncio.to_thread(database.start)
            await wait_for(lambda: rows_by_status(parts) == {"sent": 50}, 60, "all rows sent")
            assert parts.relay.ready()

    try:
        asyncio.run(scenario())
    finally:
        database.stop("immediate")
    assert len(drain(rabbit.url, queue, expect=50)) == 50


@pytest.mark.databases("sqlite", "postgresql")
def test_publishing_pauses_while_the_broker_blocks_and_resumes_after(
    database_url: str, rabbit: RabbitNode, caplog: pytest.LogCaptureFixture
) -> None:
    exchange, queue = names("blocked")
    # A short confirm timeout: messages the broker holds unread while blocked must not time
    # out (their clocks restart on unblock).
    confirm_timeout = 1.0
    period = watch_period(confirm_timeout)

    def published_and_blocked(parts: Parts) -> bool:
        published = sample_value(parts.metrics, "relay_published_total")
        return published > 0 and len(logged(caplog, "broker_blocked")) > 0

    async def scenario() -> None:
        config = settings(database_url, rabbit.url, confirm_timeout=confirm_timeout, lease=10)
        async with Running(config, simple_topology(exchange, queue)) as parts:
            await wait_for(parts.relay.ready, 30, "relay connected")
            rabbit.ctl("set_vm_memory_high_watermark", "0.0000001")  # a memory alarm: block
            try:
                enqueue(parts, [NewMessage(f"{i}".encode(), exchange, "k") for i in range(100)])
                # Rows went out into the alarm, and the broker blocked the connection: nothing
                # is published after that, so every row in flight went out before this.
                await wait_for(
                    lambda: published_and_blocked(parts), 30, "rows published, then blocked"
                )
                # Their confirms are a confirm timeout overdue by the end of this sleep, and the
                # publisher looks for overdue ones every watch period on this event loop, whose
                # timers run in order: it has looked at least once since they were overdue.
                await asyncio.sleep(confirm_timeout + 2 * period)
                assert "sent" not in rows_by_status(parts), "rows sent while blocked"
                assert sample_value(parts.metrics, "relay_outcomes_total", outcome="timed_out") == 0
                assert 0 < sample_value(parts.metrics, "relay_in_flight") <= 1000
                # Connected and publishing nothing: not ready (a rollout must not go on).
                assert (parts.relay.unready() or "").startswith("the broker blocks publishing")
            finally:
                rabbit.ctl("set_vm_memory_high_watermark", "0.4")
            await wait_for(lambda: rows_by_status(parts) == {"sent": 100}, 60, "all rows sent")
            assert parts.relay.ready()
            assert sample_value(parts.metrics, "relay_broker_connections_total") == 1, (
                "blocking cost a reconnect"
            )
            assert sample_value(parts.metrics, "relay_outcomes_total", outcome="timed_out") == 0

    asyncio.run(scenario())
    assert len(drain(rabbit.url, queue, expect=100)) == 100


def test_a_quorum_queue_gets_every_row_and_the_relay_reports_the_broker_version(
    postgresql_url: str, rabbit: RabbitNode
) -> None:
    """The same topology on 3.10 and 4.0: a quorum queue with a delivery limit."""
    exchange, queue = names("quorum")
    topology = simple_topology(exchange, queue, {"x-queue-type": "quorum", "x-delivery-limit": 5})
    version = rabbit.ctl("version").strip()

    async def scenario() -> None:
        async with Running(settings(postgresql_url, rabbit.url), topology) as parts:
            enqueue(parts, [NewMessage(b"q%d" % i, exchange, "k") for i in range(200)])
            await wait_for(lambda: rows_by_status(parts) == {"sent": 200}, 30, "all rows sent")
            [node] = [
                (sample.labels, sample.value)
                for family in parts.metrics.registry.collect()
                if family.name == "relay_broker_node_info"
                for sample in family.samples
            ]
            assert node[1] == 1
            assert node[0]["address"] == f"127.0.0.1:{rabbit.port}"
            assert (node[0]["product"], node[0]["version"]) == ("RabbitMQ", version)
            assert node[0]["cluster"]

    asyncio.run(scenario())
    assert "quorum" in rabbit.ctl("list_queues", "name", "type")
    assert {d.body for d in drain(rabbit.url, queue, expect=200)} == {
        b"q%d" % i for i in range(200)
    }
