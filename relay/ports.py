"""What the loop needs from the database and the broker: two narrow protocols.

The loop (``relay.relay``) sees only these; ``relay.db.claims.ClaimStore`` and
``relay.broker.publisher.PikaPublisher`` implement them for real, ``tests/support/fakes.py`` in
memory, and the contract suites (``tests/contract/``) hold the fakes to the real ones.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from relay.buckets import Fence
from relay.records import Answers, BacklogStats, OutboxRow, PublisherState, SettleBatch


class Store(Protocol):
    """The outbox as the loop sees it: due rows under a lease, and their outcomes. Every time
    is the store's own (the database's clock): the loop passes none."""

    def claim(
        self,
        limit: int,
        max_bytes: int,
        first_always: bool = False,
        skip: Collection[str] = (),
    ) -> list[OutboxRow]:
        """Up to ``limit`` due rows of this relay's share whose payloads add up to at most
        ``max_bytes``, held by it until settled, in id order; with ``first_always``, the
        first due row even if larger; none for the exchanges in ``skip``."""

    def settle(self, batch: SettleBatch) -> None:
        """Record outcomes: acked rows sent, the others as the batch says."""

    # Why this relay's last turn took no bucket though it could publish: relays of another
    # protocol stand in the way (``relay.buckets.fence``); None otherwise.
    fenced: Fence | None

    def turn(self, active: bool = True) -> float:
        """Renew this relay's share of the outbox (``relay.buckets``); ``active``: it can
        publish now (a relay that cannot gives its idle share to the others). Claims take
        nothing before the first turn. Returns the seconds its buckets are leased for, from
        the moment the call started at the latest (``relay.lease``)."""

    def hasten(self, exchanges: Sequence[str]) -> int:
        """Pending rows for these exchanges that wait out a back-off, and that no relay
        holds, due now (their destination was found again); returns how many."""

    def may_hold(self, first: int, last: int) -> bool:
        """Whether a row with an id from ``first`` to ``last`` would lie in this relay's
        share as its last turn left it (``relay.buckets.any_in``). No I/O: any thread."""

    def backlog(self) -> BacklogStats: ...


class Publisher(Protocol):
    """The broker as the loop sees it: a window of unconfirmed publishes. The loop reads its
    ``state``, hands it rows, and is woken (``run``'s ``wake``) when there is something to
    ``take``. Every row handed over comes back exactly once, settled."""

    window: int  # the most confirms outstanding at once

    def state(self) -> PublisherState: ...

    def publish(self, rows: Sequence[OutboxRow]) -> None:
        """Publish ``rows``, at most ``state().capacity`` of them (called every turn, with none
        too: rows held back earlier may go out now). A row the broker cannot be asked about
        (rejected as stored, of a refused exchange, no channel, the relay's lease running
        short: ``relay.lease``) is settled at once; a suspect (``relay.broker.quarantine``)
        waits until nothing else is in flight."""

    def release(self, rows: Sequence[OutboxRow], reason: str = ...) -> None:
        """Rows claimed for publishing that will not be published now (the broker blocked
        or went away, the relay's lease runs short, or it stops): settled LOST for
        ``reason``, due again at once."""

    def take(self) -> Answers:
        """What went out, what became of rows, and which exchanges are back, since the last
        call."""

    async def run(
        self, wake: Callable[[], None], answered: Callable[[], None] | None = None
    ) -> None:
        """Connect, keep reconnecting with back-off, until ``close``; call ``wake`` whenever
        there is something to take, or the state changed (a connect, an unblock), but for
        the broker's confirms, which call ``answered`` (``wake`` if none is given): the caller
        may leave those to take later."""

    async def close(self) -> None:
        """Close the connection; rows still awaiting an answer are lost (due again)."""
