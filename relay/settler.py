"""The settle task: what the broker answered, written to the store in batched updates, beside
the claims (their database round trips overlap instead of adding up). A task of the relay loop
(``relay.relay``), which hands it the publisher's answers (``add``).

The outcomes wait together (``relay.batching``: when they are settled alone, and which the next
claim takes along, ``riding``); each settle's rows go through the settle policy
(``relay.settle``: sent, retried later, or parked), their spans end, and once the store has
recorded them (``settled``) the loop hears how many bytes that freed and whether rows are due
again. Exchanges the broker serves again have their rows' back-off cut short (``hasten``).
Parked rows are logged a line each until they come by the hundred (``relay.parked``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from relay.batching import SettleBatching
from relay.constants import PARKED_LOG_INTERVAL_S
from relay.errors import StoreError
from relay.metrics import Metrics
from relay.parked import ParkedLog
from relay.records import PARKED, RowChange, SettleBatch, Settlement
from relay.retrying import RetryingStore
from relay.settle import SettlePolicy
from relay.tracing import NoTracing, Tracing
from relay.wakeup import Wakeup


class Settling(NamedTuple):
    """Outcomes on their way to the store: the settlements, the batch they write, the rows it
    parks and their log fields."""

    pending: list[Settlement]
    batch: SettleBatch
    parked: list[RowChange]
    traced: dict[int, dict[str, str]]


class Settler:
    def __init__(
        self,
        store: RetryingStore,
        policy: SettlePolicy,
        metrics: Metrics,
        tracing: Tracing | None,
        batching: SettleBatching,
        *,
        pressed: Callable[[], bool],
        settled: Callable[[int, bool], None],
    ) -> None:
        self.store = store
        self.policy = policy
        self.metrics = metrics
        self.tracing = tracing or NoTracing()
        self._batching = batching
        self._clock = store.clock  # the loop's, which the store's deadline is on
        self._pressed = pressed  # the loop waits on the settle (``SettleBatching.due``)
        # Each write recorded (a settle, a hasten): the bytes it freed of the byte budget,
        # and whether it made rows due again.
        self._on_settled = settled
        self._recovered: list[str] = []  # exchanges found again, whose rows to make due
        self._wanted = Wakeup()
        self._finished = False  # the loop has drained: settle what waits, then end
        self._parked_log = ParkedLog(PARKED_LOG_INTERVAL_S, store.clock)

    @property
    def waiting(self) -> int:
        """Outcomes not yet settled."""
        return len(self._batching)

    def add(self, settlements: list[Settlement]) -> None:
        """Outcomes to settle (the loop hands over the publisher's answers every turn)."""
        if settlements and self._batching.add(self._clock(), settlements, self._pressed()):
            self._wanted.set()

    def recovered(self, exchanges: list[str]) -> None:
        """The broker serves these exchanges again: their rows are due now."""
        self._recovered.extend(exchanges)
        self._wanted.set()

    def ask(self) -> None:
        """Look now: the loop waits on the settle."""
        self._wanted.set()

    def finish(self) -> None:
        """Nothing more will come: settle what waits, and end."""
        self._finished = True
        self._wanted.set()

    def riding(self, now: float, backlog: bool) -> Settling:
        """The outcomes the next claim records first, in its own call to the store (one
        worker-thread hop, not two): ``SettleBatching.ride``."""
        return self._settling(self._batching.ride(now, backlog))

    def put_back(self, settling: Settling) -> None:
        """``settling`` was not recorded (only when stopping past the drain's deadline)."""
        self._batching.put_back(settling.pending)

    async def run(self, collect: Callable[[], object]) -> None:
        """Settle what waits when it is due (``relay.batching``), ``collect``-ing the
        publisher's answers first (confirms the loop was not woken for); hasten the rows of
        exchanges found again; log the parked rows that waited to be logged together, even
        while nothing else is settled. Ends once ``finish``-ed and nothing waits, or when
        the database stayed down through the drain (the loop reports what waits)."""
        batching = self._batching
        while not (self._finished and not batching):
            until = batching.until(self._clock())
            await self._wanted.wait(PARKED_LOG_INTERVAL_S / 4 if until is None else until)
            collect()
            if batching.due(self._clock(), self._pressed()):
                await self._settle(batching.take())
            await self._hasten()
            self._parked_log.flush()
            if batching and self._clock() >= self.store.deadline:
                break
        self._parked_log.flush(every=True)

    async def _settle(self, pending: list[Settlement]) -> None:
        settling = self._settling(pending)
        try:
            await self.store.settle(settling.batch)
        except StoreError:
            self.put_back(settling)
            return
        self.settled(settling)

    def _settling(self, pending: list[Settlement]) -> Settling:
        """What ``pending`` writes, and what its settle reports once recorded."""
        batch = self.policy.batch(pending)
        parked = [c for c in batch.changes if c.status == PARKED]
        # Taken before the spans end: a parked row's log line names its last publish span.
        rows = {s.row.id: s.row for s in pending} if parked else {}
        traced = {c.id: self.tracing.log_fields(rows[c.id]) for c in parked}
        self.tracing.finish(pending, batch)
        return Settling(pending, batch, parked, traced)

    def settled(self, settling: Settling) -> None:
        """``settling``'s outcomes are recorded."""
        if not settling.pending:
            return
        freed = sum(s.row.size for s in settling.pending)
        # With per-key ordering a settle frees the next row of each key it settles: rows due
        # that no claim looks for (without a linger none comes unasked, and each waited for
        # the poll: a key moved a row per half second).
        self._on_settled(freed, self._batching.ordering or bool(settling.batch.changes))
        self.metrics.settled(settling.pending, len(settling.parked))
        self._parked_log.parked(settling.parked, settling.traced)

    async def _hasten(self) -> None:
        """Rows of exchanges found again are due now, not when their back-off ends."""
        if not self._recovered or self._finished:
            return
        exchanges, self._recovered = self._recovered, []
        try:
            await self.store.hasten(exchanges)
        except StoreError:
            return  # stopping past the drain deadline: the rows wait out their back-off
        self._on_settled(0, True)  # no room freed; rows due now
