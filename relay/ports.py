"""What the loop needs from the database and the broker: two narrow protocols.

The loop (``relay.relay``) sees only these; ``relay.db.claims.ClaimStore`` and
``relay.broker.publisher.PikaPublisher`` implement them for real, ``tests/support/fakes.py`` in
memory, and the contract tests hold the fakes to the real ones.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import Protocol

from relay.records import BacklogStats, OutboxRow, SettleBatch, Settlement


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

    def turn(self, active: bool = True) -> None:
        """Renew this relay's share of the outbox (``relay.buckets``); ``active``: it can
        publish now (a relay that cannot gives its idle share to the others). Claims take
        nothing before the first turn."""

    def hasten(self, exchanges: Sequence[str]) -> int:
        """Pending rows for these exchanges that wait out a back-off, and that no relay
        holds, due now (their destination was found again); returns how many."""

    def backlog(self) -> BacklogStats: ...


class Publisher(Protocol):
    """The broker as the loop sees it: a window of unconfirmed publishes."""

    window: int  # the most confirms outstanding at once

    @property
    def connected(self) -> bool:
        """A confirm channel is open and the topology declared (it may still be blocked)."""

    @property
    def in_flight(self) -> int:
        """Published rows awaiting the broker's answer."""

    @property
    def can_publish(self) -> bool:
        """Connected and not blocked by the broker."""

    def capacity(self) -> int:
        """How many more rows may be published now: 0 unless connected and not blocked."""

    def release(self, rows: Sequence[OutboxRow]) -> None:
        """Rows claimed for publishing that will not be published now (the broker blocked
        or went away, or the relay stops): due again at once, through ``take_settled``."""

    def publish(self, rows: Sequence[OutboxRow]) -> list[OutboxRow]:
        """Publish ``rows`` (called every turn, with none too); returns the rows that went out,
        rows held back on an earlier call among them. The others are settled already
        (rejected, or lost with the channel; they come out of ``take_settled``) or held back
        until nothing else is in flight (suspects, see ``relay.broker.publisher``)."""

    def take_settled(self) -> list[Settlement]:
        """What became of published rows since the last call."""

    def broken_exchanges(self) -> frozenset[str]:
        """The exchanges the broker refuses now: their rows are held, not published."""

    def take_recovered(self) -> list[str]:
        """Exchanges found again since the last call after the broker refused them (see
        ``relay.broker.destinations``): their held rows should be due now."""

    async def run(self, wake: Callable[[], None]) -> None:
        """Connect, keep reconnecting with back-off, until ``close``; call ``wake`` whenever
        something the loop waits for happened (an answer, a connect, an unblock)."""

    async def close(self) -> None:
        """Close the connection; rows still awaiting an answer are lost (due again)."""
