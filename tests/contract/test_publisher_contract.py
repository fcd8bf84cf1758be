"""One contract, two publishers: the scripted fake and ``PikaPublisher`` on a real RabbitMQ
node behave alike, as the loop sees them (``relay.ports.Publisher``).

The loop's unit tests run on the fake; these tests keep it honest. Each scenario is driven as
the loop drives a publisher: it hands rows over, and waits to be woken (never polls) before it
takes what came back. The broker routes routing key ``routed`` to a queue and nothing else:
the fake answers the same way."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any, Protocol

import pytest

from devtools.broker import names, simple_topology
from devtools.servers import RabbitNode
from relay.backoff import Backoff
from relay.broker.confirms import RELEASED
from relay.broker.publisher import PikaPublisher
from relay.lease import LEASE_SHORT, Lease
from relay.ports import Publisher
from relay.records import OutboxRow, Outcome, Settlement
from tests.support.fakes import ScriptedPublisher
from tests.support.rows import row

WINDOW = 8
ANSWER_S = 30.0  # the longest a scenario waits to be woken
LEASE_MARGIN = 60.0


class Opener(Protocol):
    def __call__(self) -> contextlib.AbstractAsyncContextManager[Driver]: ...


class Driver:
    """A publisher driven as the loop drives it; ``exchange`` is the one it may publish to;
    ``lease`` the relay's, which the publisher checks (renewed for the day)."""

    def __init__(self, publisher: Publisher, exchange: str, lease: Lease) -> None:
        self.publisher = publisher
        self.lease = lease
        self.exchange = exchange
        self.published: list[OutboxRow] = []
        self.settled: list[Settlement] = []
        self._woken = asyncio.Event()

    def wake(self) -> None:
        self._woken.set()

    def rows(self, first: int, count: int, **fields: Any) -> list[OutboxRow]:
        fields = {"exchange": self.exchange, "routing_key": "routed", **fields}
        return [
            row(i, message_id=f"{self.exchange}-{i}", **fields) for i in range(first, first + count)
        ]

    def take(self) -> None:
        answers = self.publisher.take()
        self.published += answers.published
        self.settled += answers.settled

    async def until(self, condition: Callable[[], bool]) -> None:
        """Take what comes back each time the publisher wakes us, until ``condition``."""
        async with asyncio.timeout(ANSWER_S):
            while True:
                self.take()
                if condition():
                    return
                await self._woken.wait()
                self._woken.clear()

    async def more(self) -> None:
        """Until at least one more row came back."""
        answered = len(self.settled)
        await self.until(lambda: len(self.settled) > answered)

    def outcomes(self, rows: Iterable[OutboxRow]) -> dict[int, Outcome]:
        ids = {r.id for r in rows}
        return {s.row.id: s.outcome for s in self.settled if s.row.id in ids}


def _lease() -> Lease:
    lease = Lease(LEASE_MARGIN, time.monotonic)
    lease.renewed(time.monotonic() + 86400)
    return lease


@contextlib.asynccontextmanager
async def _fake() -> AsyncIterator[Driver]:
    lease = _lease()
    publisher = ScriptedPublisher(
        lambda r: "ack" if r.routing_key == "routed" else "return", window=WINDOW, lease=lease
    )
    driver = Driver(publisher, "fake", lease)
    running = asyncio.create_task(publisher.run(driver.wake))
    yield driver
    await publisher.close()
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)


def _real(node: RabbitNode) -> Opener:
    @contextlib.asynccontextmanager
    async def opened() -> AsyncIterator[Driver]:
        exchange, queue = names("contract")
        lease = _lease()
        publisher = PikaPublisher(
            [node.url],
            simple_topology(exchange, queue, routing_key="routed"),
            window=WINDOW,
            confirm_timeout=ANSWER_S,
            reconnect=Backoff(0.05, 1),
            lease=lease,
        )
        driver = Driver(publisher, exchange, lease)
        running = asyncio.create_task(publisher.run(driver.wake))
        await driver.until(lambda: publisher.state().connected)
        yield driver
        await publisher.close()
        await running

    return opened


@pytest.fixture(params=["fake", "rabbitmq"])
def opener(request: pytest.FixtureRequest) -> Opener:
    if request.param == "fake":
        return _fake
    return _real(request.getfixturevalue("rabbit"))


def run(opener: Opener, scenario: Callable[[Driver], Any]) -> None:
    async def main() -> None:
        async with opener() as driver:
            await scenario(driver)

    asyncio.run(main())


def test_every_row_handed_over_comes_back_once_and_the_window_is_kept(opener: Opener) -> None:
    async def scenario(d: Driver) -> None:
        assert d.publisher.state().capacity == WINDOW
        rows = d.rows(1, 20)
        pending = list(rows)
        while pending or len(d.settled) < len(rows):
            room = d.publisher.state().capacity
            assert room <= WINDOW - d.publisher.state().in_flight
            d.publisher.publish(pending[:room])
            pending = pending[room:]
            await d.more()
        assert d.published == rows
        assert sorted(s.row.id for s in d.settled) == [r.id for r in rows]
        assert set(d.outcomes(rows).values()) == {Outcome.ACKED}
        assert d.publisher.state().in_flight == 0

    run(opener, scenario)


def test_an_unroutable_row_is_returned_not_acked(opener: Opener) -> None:
    async def scenario(d: Driver) -> None:
        routed, lost = d.rows(1, 1), d.rows(2, 1, routing_key="nowhere")
        d.publisher.publish(routed + lost)
        await d.until(lambda: len(d.settled) == 2)
        assert d.outcomes(routed + lost) == {1: Outcome.ACKED, 2: Outcome.RETURNED}
        (returned,) = (s for s in d.settled if s.row.id == 2)
        assert "312 NO_ROUTE" in returned.detail

    run(opener, scenario)


def test_a_row_that_cannot_be_published_as_stored_is_rejected_at_once(opener: Opener) -> None:
    async def scenario(d: Driver) -> None:
        bad = d.rows(1, 1, headers="[1, 2]")  # not a JSON object
        good = d.rows(2, 1)
        d.publisher.publish(bad + good)
        await d.until(lambda: len(d.settled) == 2)
        assert d.outcomes(bad + good) == {1: Outcome.REJECTED, 2: Outcome.ACKED}
        assert d.published == good

    run(opener, scenario)


def test_released_rows_come_back_lost_unpublished(opener: Opener) -> None:
    async def scenario(d: Driver) -> None:
        rows = d.rows(1, 3)
        d.publisher.release(rows)
        await d.until(lambda: len(d.settled) == 3)
        assert d.outcomes(rows) == dict.fromkeys((1, 2, 3), Outcome.LOST)
        assert {s.detail for s in d.settled} == {RELEASED}
        assert d.published == []

    run(opener, scenario)


def test_a_suspect_goes_out_alone_once_nothing_else_is_in_flight(opener: Opener) -> None:
    async def scenario(d: Driver) -> None:
        plain, suspect = d.rows(1, 3), d.rows(4, 1, suspect=True)
        d.publisher.publish(suspect + plain)
        assert d.publisher.state().capacity == 0, "others joined the window beside a suspect"
        d.take()
        assert d.published == plain
        await d.until(lambda: len(d.settled) == 4)
        assert d.published == plain + suspect
        assert set(d.outcomes(plain + suspect).values()) == {Outcome.ACKED}
        assert d.publisher.state().capacity == WINDOW

    run(opener, scenario)


def test_nothing_goes_out_once_the_lease_runs_short_not_even_a_suspect_held_back(
    opener: Opener,
) -> None:
    """A relay that froze past its lease (or cannot renew it) publishes nothing: rows handed
    over, and a suspect that waited for the window to empty, come back lost unpublished."""

    async def scenario(d: Driver) -> None:
        first, suspect = d.rows(1, 2), d.rows(3, 1, suspect=True)
        d.publisher.publish(first + suspect)
        d.take()
        assert d.published == first, "the suspect waits for the others' confirms"
        d.lease.renewed(time.monotonic() + LEASE_MARGIN / 2)
        later = d.rows(4, 2)
        d.publisher.publish(later)
        await d.until(lambda: len(d.settled) == 5)
        assert d.published == first
        assert d.outcomes(first) == {1: Outcome.ACKED, 2: Outcome.ACKED}
        assert d.outcomes(suspect + later) == dict.fromkeys((3, 4, 5), Outcome.LOST)
        assert {s.detail for s in d.settled if s.outcome is Outcome.LOST} == {LEASE_SHORT}

    run(opener, scenario)


def test_after_close_every_row_handed_over_has_come_back(opener: Opener) -> None:
    async def scenario(d: Driver) -> None:
        rows = d.rows(1, WINDOW)
        d.publisher.publish(rows)
        await d.publisher.close()
        d.take()
        assert sorted(s.row.id for s in d.settled) == [r.id for r in rows]
        assert {s.outcome for s in d.settled} <= {Outcome.ACKED, Outcome.LOST}
        assert d.publisher.state().in_flight == 0

    run(opener, scenario)
