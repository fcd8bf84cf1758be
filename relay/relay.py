"""The relay loop: claim due rows, publish them with confirms, settle what the broker answered.

Runs on one asyncio event loop together with the publisher (see ``relay.broker.publisher`` for
why); each database call runs in a worker thread, retried through outages
(``relay.retrying``). The publisher streams: up to ``window`` confirms are outstanding while
the loop claims and publishes the next rows, and its answers wake the loop to settle them in
batched updates, beside the claims.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable

from relay.backoff import Backoff
from relay.batching import SettleBatching
from relay.budget import ByteBudget
from relay.constants import LIVENESS_LIMIT_S
from relay.errors import RelayError, StoreError
from relay.lease import LEASE_LAPSED, LEASE_SHORT, Lease
from relay.metrics import Metrics
from relay.pacing import ClaimPacing, Counts, Decision
from relay.ports import Publisher, Store
from relay.records import OutboxRow, Outcome, Settlement
from relay.retrying import RetryingStore
from relay.settle import SettlePolicy
from relay.settler import Settler
from relay.tracing import Tracing
from relay.turns import Turns
from relay.wakeup import Wakeup

log = logging.getLogger(__name__)


class Relay:
    def __init__(
        self,
        store: Store,
        publisher: Publisher,
        policy: SettlePolicy,
        metrics: Metrics,
        lease: Lease,
        *,
        batch_size: int,
        max_inflight_bytes: int,
        poll_interval: float,
        drain_timeout: float,
        linger: float = 0.0,
        ordering: bool = False,
        turn_interval: float,
        retry: Backoff,
        tracing: Tracing | None = None,
        database_failed: Callable[[], None] = lambda: None,
    ) -> None:
        """``database_failed``: told whenever a database call fails (``RetryingStore``)."""
        # Every time the loop keeps is a duration on the lease's clock (``relay.lease``).
        clock = self._clock = lease.clock
        self.store = db = RetryingStore(
            store, retry, metrics, self._beat, clock, failed=database_failed
        )
        self.publisher, self.metrics, self.drain_timeout = publisher, metrics, drain_timeout
        self.lease = lease  # renewed by the turns; checked before each claim and each send
        self.turns = Turns(db, lease, metrics, turn_interval, turned=self.wake, retire=self.stop)
        self.budget = ByteBudget(max_inflight_bytes)
        self.pacing = ClaimPacing(linger, poll_interval, batch_size, publisher.window, clock())
        gathered = SettleBatching(linger, ordering, min(batch_size, publisher.window), clock())
        self.settler = Settler(
            db, policy, metrics, tracing, gathered, pressed=self._pressed, settled=self._settled
        )
        self.idle = threading.Event()  # set while the probe of new rows looks (``relay.pacing``)
        self.idle.set()
        self._ready: list[OutboxRow] = []  # claimed, waiting for room in the window
        self._ready_epoch = lease.epoch  # the lease they were claimed under
        self._claim_wanted = Wakeup()  # rows may be due, or room was freed
        self._woken = Wakeup()  # the broker's answers and connects, new rows, settles, stop
        self._stopping = asyncio.Event()
        self._last_beat = clock()

    async def run(self) -> bool:
        """Relay until ``stop``; then drain. True when every outcome was recorded."""
        publishing = asyncio.create_task(
            self.publisher.run(self._answered, self._confirmed), name="publisher"
        )
        claiming = asyncio.create_task(self._claim_until_stopped(), name="claim")
        settling = asyncio.create_task(self.settler.run(self._collect), name="settle")
        turning = asyncio.create_task(self.turns.run(self._can_publish), name="turn")
        # The loop lives by all four: one that ended before the stop failed (no retry could
        # help), and so does the relay, at once, rather than stay alive and ready settling,
        # publishing or claiming nothing.
        tasks = (publishing, claiming, settling, turning)
        for task in tasks:
            task.add_done_callback(self._task_ended)
        try:
            while not self._stopping.is_set():
                self._beat()
                for task in tasks:
                    if task.done():
                        _failed(task)
                self.turns.check(self._can_publish())
                self._collect()
                self._publish_ready()
                decision = self._decide()
                if decision.rows:
                    self._claim_wanted.set()
                await self._wait(decision.wait)
            self._claim_wanted.set()
            await claiming  # a claim under way finishes: its rows are released with the rest
            self.publisher.release(self._ready)  # due again at once, for whoever claims next
            self._ready = []
            drained = await self._drain(settling)
            if self.turns.retired is not None:
                raise self.turns.retired
            return drained
        finally:
            for task in (turning, claiming, settling):
                task.cancel()
            await self.publisher.close()
            publishing.cancel()
            await asyncio.gather(publishing, claiming, settling, turning, return_exceptions=True)

    def _task_ended(self, _task: asyncio.Task[None]) -> None:
        self._woken.set()

    def wake(self) -> None:
        """Rows may be due that no claim has looked for (new rows were announced, or rows
        were settled due again): claim now (or once the linger after the last claim is
        over), not at the next poll."""
        self.pacing.asked()
        self._claim_wanted.set()
        self._woken.set()

    def new_rows(self, after: int | None, newest: int | None) -> None:
        """The outbox's newest id grew from ``after`` to ``newest`` (the probe of new rows:
        ``relay.db.probe``; None: unknown, or no row): ``wake`` if the rows in between may
        lie in this relay's buckets. Every relay's probe sees every commit, and a row lies
        in one relay's buckets: woken for each, two relays made an empty claim a row."""
        if after is None or newest is None or self.store.may_hold(after + 1, newest):
            self.wake()

    def _answered(self) -> None:
        """The publisher has news (an answer, a connect), or claimed rows are ready: turn the
        loop to publish and settle. By itself no reason to look for due rows: after a claim found
        the backlog empty, claiming again on every confirm was an empty query per ack frame
        (thousands in a drain's last seconds)."""
        self._woken.set()

    def _confirmed(self) -> None:
        """The broker's confirms came in. Worth a turn of the loop only when it waits on them:
        rows wait for room in the window, no outcome waits to be settled yet (the first one
        sets the settle's time), or the relay stops. Otherwise they wait in the publisher
        until the loop's next turn, or the settle's, within a linger: at a steady stream a
        turn per confirm frame was most of the loop's turns."""
        unsettled = self.settler.waiting
        if self._ready or not unsettled or self._stopping.is_set() or not self.pacing.linger:
            self._woken.set()

    def stop(self) -> None:
        """Stop claiming; outstanding confirms get ``drain_timeout`` seconds to arrive."""
        if not self._stopping.is_set():
            self.store.deadline = self._clock() + self.drain_timeout
            self._stopping.set()
            self.wake()

    def alive(self) -> bool:
        return self._clock() - self._last_beat < LIVENESS_LIMIT_S

    def unready(self) -> str | None:
        """Why this relay cannot work now, or None: it is ready (``/readyz``). A relay the
        broker blocks (a memory or disk alarm) publishes nothing: not ready. A relay
        waiting on a protocol fence is ready: its turns work, and it takes its share once
        the relays in its way have stopped (a rollout must go on to stop them)."""
        if (problem := self.store.problem) is not None:
            return problem
        state = self.publisher.state()
        if not state.connected:
            return "no confirm channel to the broker (see the broker_retry log lines)"
        if not state.can_publish:
            return (
                "the broker blocks publishing: a resource alarm (see the broker_blocked log lines)"
            )
        return None

    def ready(self) -> bool:
        return self.unready() is None

    def _can_publish(self) -> bool:
        return self.publisher.state().can_publish

    def _beat(self) -> None:
        self._last_beat = self._clock()

    async def _claim_until_stopped(self) -> None:
        """Keep rows ready for the window, beside the publishing loop: a claim's round trip
        then delays no publish (confirms that free the window are answered from rows
        claimed ahead)."""
        while not self._stopping.is_set():
            # Asked for by the loop (rows may be due, room freed), or the next claim's time.
            await self._claim_wanted.wait(self.pacing.until(self._clock()))
            # Asked for, maybe, while the last claim ran: the linger after it holds still.
            while (wanted := self._decide().rows) and not self._stopping.is_set():
                if not await self._claim(wanted):
                    break

    async def _claim(self, wanted: int) -> bool:
        """Claim up to ``wanted`` rows, taking along the outcomes whose settle time has come,
        and hand the window what it takes; whether the claim came back full."""
        began = self._clock()
        self.pacing.began(began)
        room = self.budget.room
        epoch = self.lease.epoch
        riding = self.settler.riding(began, self.pacing.backlog)
        skip = self.pacing.skip(began, self.publisher.state().broken)
        try:
            rows = await self.store.claim(wanted, room, self.budget.empty, skip, riding.batch)
        except StoreError:
            self.settler.put_back(riding)  # stopping past the deadline
            raise
        self.settler.settled(riding)
        got, claimed = len(rows), sum(r.size for r in rows)
        self._hold(claimed)
        if self.lease.epoch != epoch:  # claimed under a lease that lapsed since
            self.publisher.release(rows, LEASE_LAPSED)
            rows = []
        if self._ready_epoch != self.lease.epoch:
            self._release_ready(LEASE_LAPSED)
        self._ready_epoch = self.lease.epoch
        self._ready += self._without_duplicates(rows)
        self._publish_ready()  # here, not a turn of the loop later
        cut = got < wanted and self.budget.cut_short(got, claimed, room)  # as claimed
        self.pacing.claimed(began, wanted, got, len(rows), cut)
        if self.pacing.listening:
            self.idle.set()
        else:
            self.idle.clear()
        return len(rows) == wanted

    def _without_duplicates(self, rows: list[OutboxRow]) -> list[OutboxRow]:
        """``rows`` less those whose message was sent before (``OutboxRow.sent_before``):
        those go straight to the settle, never to the broker."""
        if not any(r.sent_before for r in rows):
            return rows
        self.settler.add([Settlement(r, Outcome.DUPLICATE) for r in rows if r.sent_before])
        return [r for r in rows if not r.sent_before]

    def _decide(self) -> Decision:
        """Whether to claim now, how many rows, and how long to wait otherwise
        (``relay.pacing``)."""
        state = self.publisher.state()
        counts = Counts(
            state.can_publish and self.lease.holds(),
            state.capacity,
            state.in_flight,
            len(self._ready),
            self.settler.waiting,
            self.budget.waits,
        )
        return self.pacing.decide(self._clock(), counts)

    def _hold(self, size: int) -> None:
        self.budget.hold(size)
        self.metrics.held_bytes.set(self.budget.held)
        if size > 0 and self.budget.spent and self.settler.waiting:
            self.settler.ask()  # claims wait for the room a settle frees

    def _publish_ready(self) -> None:
        """Hand the publisher what its window takes now (nothing too: it may have rows it
        held back to send now)."""
        state = self.publisher.state()
        if self._ready and not state.can_publish:
            # Blocked or disconnected for who knows how long: the rows must not sit here
            # while their leases run out.
            self.publisher.release(self._ready)
            self._ready = []
        if self._ready and not self.turns.holds():
            # Another relay may take these rows' buckets soon, or has (this relay froze, or
            # its turns fail): they are its to publish now, and publishing them here could
            # put a row after a later row of its key (``relay.lease``).
            self._release_ready(LEASE_SHORT)
        if self._ready and self._ready_epoch != self.lease.epoch:
            self._release_ready(LEASE_LAPSED)  # it lapsed and was renewed since their claim
        offered, self._ready = self._ready[: state.capacity], self._ready[state.capacity :]
        self.publisher.publish(offered)

    def _release_ready(self, reason: str) -> None:
        self.publisher.release(self._ready, reason)
        self._ready = []

    def _collect(self) -> int:
        """Hand the publisher's answers to the settle task (which runs beside the claims, so
        that the two database round trips overlap instead of adding up); rows in flight."""
        answers = self.publisher.take()
        self.metrics.published.inc(len(answers.published))
        self.metrics.republished.inc(sum(1 for r in answers.published if r.republish))
        self.settler.add(answers.settled)
        if answers.recovered:
            self.settler.recovered(answers.recovered)
        in_flight = self.publisher.state().in_flight
        self.metrics.in_flight.set(in_flight)
        return in_flight

    def _pressed(self) -> bool:
        """The loop waits on the settle: claims pause while the byte budget is spent, and the
        relay stops."""
        return self.budget.spent or self._stopping.is_set()

    def _settled(self, freed: int, due_again: bool) -> None:
        """A settle (or a hasten) is recorded: it freed ``freed`` bytes of the budget, which
        claiming may have paused for; rows it made due again are for a claim."""
        self._hold(-freed)
        if due_again:
            self.wake()
        else:
            self._answered()

    async def _drain(self, settling: asyncio.Task[None]) -> bool:
        in_flight = self._collect()
        log.info("draining %d outstanding confirms", in_flight, extra={"action": "drain"})
        while self._collect() and self._clock() < self.store.deadline:
            self._beat()
            await self._wait(min(0.1, self.pacing.poll_interval))
        await self.publisher.close()  # whatever is still outstanding is now LOST: due again
        self._collect()
        self.settler.finish()
        await settling
        if unrecorded := self.settler.waiting:
            log.error(
                "%d outcomes could not be recorded; those rows are due again when their "
                "lease ends, and may be published twice",
                unrecorded,
                extra={"action": "drain_incomplete"},
            )
        else:
            log.info("drained", extra={"action": "drained", "in_flight_at_stop": in_flight})
        return not unrecorded

    async def _wait(self, timeout: float) -> None:
        """Until ``wake`` was called (since the last wait returned) or ``timeout`` seconds."""
        await self._woken.wait(timeout)


def _failed(task: asyncio.Task[None]) -> None:
    """Raise why ``task``, one the loop lives by, ended before the relay stopped."""
    task.result()  # its own error, if it raised one
    raise RelayError(f"the relay's {task.get_name()} task ended before the relay stopped")
