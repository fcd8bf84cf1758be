"""A destination the broker refuses, by permission or because its queue is full, against the
real broker: the good rows flow, the relay keeps its one connection, and a refused exchange
comes back once its permission is granted. (A missing exchange, 6,000 rows of it through
`relay run`: tests/e2e/test_destinations.py.)"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from devtools.broker import declare_bound, drain, names
from devtools.servers import RabbitNode
from relay.broker.topology import Binding, Exchange, Queue, Topology
from relay.metrics import Metrics
from relay.records import NewMessage
from tests.support.inprocess import Running, enqueue, rows_by_status, settings, table, wait_for
from tests.support.metrics import sample_value

ROWS = 200


@pytest.fixture
def limited(rabbit: RabbitNode) -> Iterator[tuple[str, str]]:
    """(a user who may write only to names starting "ok.", the URL to connect as them)."""
    user = names("user")[1].replace(".", "-")
    rabbit.ctl("add_user", user, "secret")
    rabbit.ctl("set_permissions", "-p", "/", user, ".*", r"^ok\.", ".*")
    yield user, rabbit.url.replace("guest:guest@", f"{user}:secret@")
    rabbit.ctl("delete_user", user)


def test_an_exchange_the_user_may_not_write_to_is_held_and_tried_until_it_may(
    postgresql_url: str, rabbit: RabbitNode, limited: tuple[str, str]
) -> None:
    user, url = limited
    exchange, queue = names("ok")
    refused, refused_queue = names("refused")
    declare_bound(rabbit.url, refused, refused_queue)  # it exists: 403, not 404
    topology = Topology(
        exchanges=(Exchange(exchange, type="topic"),),
        queues=(Queue(queue),),
        bindings=(Binding(exchange, queue, "#"),),
    )
    running = Running(settings(postgresql_url, url, max_attempts=1000, window=50), topology)

    async def scenario() -> None:
        async with running as parts:
            enqueue(
                parts,
                [
                    NewMessage(f"{i}".encode(), refused if i % 2 else exchange, "k")
                    for i in range(2 * ROWS)
                ],
            )

            def good_sent_and_bad_held() -> bool:
                by_exchange = {(r.exchange, r.status) for r in table(parts) if r.attempts}
                return rows_by_status(parts).get("sent") == ROWS and (refused, "pending") in (
                    by_exchange
                )

            await wait_for(good_sent_and_bad_held, 60, "good rows sent, refused rows held")
            metrics = parts.metrics
            assert sample_value(metrics, "relay_destination_broken", exchange=refused) == 1
            reasons = {r.last_error for r in table(parts) if r.exchange == refused and r.attempts}
            # RabbitMQ 3.10: "access to exchange ...", 4.0: "write access to exchange ...".
            (reason,) = reasons
            assert reason.startswith(
                f"failed: the broker refuses exchange {refused!r}: 403 ACCESS_REFUSED - "
            )
            assert f"access to exchange '{refused}' in vhost '/' refused for user" in reason
            rabbit.ctl("set_permissions", "-p", "/", user, ".*", ".*", ".*")
            await wait_for(lambda: rows_by_status(parts) == {"sent": 2 * ROWS}, 60, "all sent")
            assert exported(parts.metrics, "relay_destination_broken", refused) is None
            assert sample_value(metrics, "relay_broker_connections_total") == 1

    asyncio.run(scenario())
    assert running.drained is True
    assert len({d.body for d in drain(rabbit.url, refused_queue, expect=ROWS)}) == ROWS


def exported(metrics: Metrics, name: str, exchange: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"exchange": exchange})


def test_a_full_queue_that_rejects_publishes_costs_nacks_not_connections(
    postgresql_url: str, rabbit: RabbitNode
) -> None:
    exchange, queue = names("good")
    full_exchange, full_queue = names("full")
    topology = Topology(
        exchanges=(Exchange(exchange, type="topic"), Exchange(full_exchange, type="topic")),
        queues=(
            Queue(queue),
            Queue(full_queue, arguments={"x-max-length": 10, "x-overflow": "reject-publish"}),
        ),
        bindings=(Binding(exchange, queue, "#"), Binding(full_exchange, full_queue, "#")),
    )
    config = settings(postgresql_url, rabbit.url, max_attempts=3, window=50)

    async def scenario() -> None:
        async with Running(config, topology) as parts:
            enqueue(
                parts,
                [
                    NewMessage(f"{i}".encode(), full_exchange if i % 2 else exchange, "k")
                    for i in range(2 * ROWS)
                ],
            )
            await wait_for(
                lambda: rows_by_status(parts) == {"sent": ROWS + 10, "parked": ROWS - 10},
                60,
                "good rows and ten full-queue rows sent, the rest parked",
            )
            parked = {r.last_error for r in table(parts) if r.status == "parked"}
            assert parked == {"nacked: basic.nack: the broker refused the message"}
            metrics = parts.metrics
            assert sample_value(metrics, "relay_broker_connections_total") == 1
            assert exported(metrics, "relay_destination_broken", full_exchange) is None

    asyncio.run(scenario())
    assert len(drain(rabbit.url, queue, expect=ROWS)) == ROWS
