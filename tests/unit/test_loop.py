"""The relay loop against the in-memory store and a scripted broker: no servers, and on a
controlled clock (``tests.support.clock``): its polls, back-offs and timeouts take no wall time."""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections.abc import Callable, Collection, Sequence

import pytest

from relay.backoff import Backoff
from relay.broker.confirms import RELEASED
from relay.constants import (
    HELD_CHARGE_INTERVAL_S,
    POLL_INTERVAL_S,
    PROTOCOL,
    TURN_INTERVAL_MAX_S,
)
from relay.errors import RetiredError, StoreError
from relay.lease import LEASE_SHORT, Lease
from relay.metrics import Metrics
from relay.records import PARKED, PENDING, SENT, NewMessage, OutboxRow, SettleBatch
from relay.relay import Relay
from relay.settle import SettlePolicy
from tests.support.clock import VirtualTimeLoop, loop_time, run
from tests.support.fakes import DatabaseClock, InMemoryStore, ScriptedPublisher
from tests.support.metrics import sample_value


def make(
    store: InMemoryStore,
    publisher: ScriptedPublisher,
    max_attempts: int = 3,
    batch_size: int = 50,
    max_inflight_bytes: int = 2**30,
    *,
    lease_margin: float = 1.0,
    linger: float = 0.0,
    ordering: bool = False,
    poll_interval: float = 0.01,
    turn_interval: float = 0.05,
    clock: Callable[[], float] = loop_time,
) -> Relay:
    """A relay on ``store`` and ``publisher``, which checks the relay's lease as the real
    publisher does (``relay.lease``), the lease carried on ``clock``."""
    publisher.lease = Lease(lease_margin, clock)
    return Relay(
        store,
        publisher,
        SettlePolicy(max_attempts, Backoff(1.0, 10.0)),
        Metrics(),
        publisher.lease,
        batch_size=batch_size,
        max_inflight_bytes=max_inflight_bytes,
        poll_interval=poll_interval,
        drain_timeout=1.0,
        linger=linger,
        ordering=ordering,
        turn_interval=turn_interval,
        retry=Backoff(0.01, 0.05),
    )


async def wait(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.005)


async def run_until(relay: Relay, condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    task = asyncio.create_task(relay.run())
    await wait(condition, timeout)
    relay.stop()
    return await task


def statuses(store: InMemoryStore) -> dict[int, str]:
    return {id: s.status for id, s in store.rows.items()}


def fill(store: InMemoryStore, n: int) -> None:
    store.enqueue([NewMessage(b"x", "ex", "rk") for _ in range(n)])


def test_every_acked_row_is_sent_and_the_window_is_never_exceeded() -> None:
    store = InMemoryStore()
    fill(store, 1000)
    publisher = ScriptedPublisher(lambda row: "ack", window=64)
    relay = make(store, publisher)
    ok = run(run_until(relay, lambda: set(statuses(store).values()) == {SENT}))
    assert ok
    assert len(publisher.published) == 1000
    assert 0 < publisher.max_in_flight <= 64
    assert sample_value(relay.metrics, "relay_outcomes_total", outcome="acked") == 1000


def test_a_row_whose_message_was_sent_before_is_dropped_and_never_published() -> None:
    store = InMemoryStore()
    store.sent_log.add("sent-before")
    store.enqueue([NewMessage(b"x", "ex", "rk", message_id=m) for m in ("a", "sent-before", "b")])
    publisher = ScriptedPublisher(lambda row: "ack")
    relay = make(store, publisher)
    ok = run(run_until(relay, lambda: set(statuses(store).values()) == {SENT}))
    assert ok
    assert [r.message_id for r in publisher.published] == ["a", "b"]
    assert [s.row.message_id for s in store.rows.values()] == ["a", "b"]
    assert store.duplicates == 1
    assert sample_value(relay.metrics, "relay_outcomes_total", outcome="duplicate") == 1
    assert sample_value(relay.metrics, "relay_outcomes_total", outcome="acked") == 2


def test_nacked_row_is_retried_after_backoff_then_parked() -> None:
    store = InMemoryStore()
    fill(store, 2)
    publisher = ScriptedPublisher(lambda row: "nack" if row.id == 1 else "ack")
    relay = make(store, publisher, max_attempts=3)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        for attempts in (1, 2):
            while store.rows[1].row.attempts < attempts:
                await asyncio.sleep(0.005)
            assert store.rows[1].status == PENDING
            assert store.rows[1].next_attempt_at > store.clock.now, "retried without back-off"
            store.clock.advance(30)
        while store.rows[1].status != PARKED:
            await asyncio.sleep(0.005)
        relay.stop()
        assert await task

    run(scenario())
    assert statuses(store) == {1: PARKED, 2: SENT}
    assert store.rows[1].row.attempts == 3
    assert store.rows[1].row.last_error == "nacked: basic.nack: the broker refused the message"
    assert [r.id for r in publisher.published].count(1) == 3
    assert sample_value(relay.metrics, "relay_parked_total") == 1


def test_returned_row_is_never_marked_sent() -> None:
    store = InMemoryStore()
    fill(store, 1)
    publisher = ScriptedPublisher(lambda row: "return")
    relay = make(store, publisher)
    run(run_until(relay, lambda: store.rows[1].row.attempts == 1))
    assert store.rows[1].status == PENDING
    assert store.rows[1].row.last_error == "returned: 312 NO_ROUTE"


def test_unconfirmed_row_times_out_and_is_republished() -> None:
    store = InMemoryStore()
    fill(store, 1)
    seen: list[int] = []

    def first_silent(row: OutboxRow) -> str | None:
        seen.append(row.id)
        return None if len(seen) == 1 else "ack"

    publisher = ScriptedPublisher(first_silent, confirm_timeout=0.05)
    relay = make(store, publisher)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        while store.rows[1].row.attempts < 1:
            await asyncio.sleep(0.005)
        store.clock.advance(30)
        while store.rows[1].status != SENT:
            await asyncio.sleep(0.005)
        relay.stop()
        await task

    run(scenario())
    assert seen == [1, 1]
    assert store.rows[1].row.last_error == "timed_out: no confirm within 0.05s"


def test_outcomes_survive_a_database_outage_and_are_recorded_after_it() -> None:
    store = InMemoryStore()
    fill(store, 10)
    publisher = ScriptedPublisher(lambda row: "ack")
    relay = make(store, publisher, batch_size=10)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        while len(publisher.published) < 10:
            await asyncio.sleep(0)
        store.failing = True  # the acks arrive while the database is down
        # The relay tried to record them, was refused, and says it cannot work.
        await wait(lambda: store.refused["settle"] >= 1 and not relay.ready())
        assert all(s.status == PENDING for s in store.rows.values())
        store.failing = False
        while any(s.status != SENT for s in store.rows.values()):
            await asyncio.sleep(0.005)
        relay.stop()
        assert await task

    run(scenario())
    assert len(publisher.published) == 10, "rows were published twice"
    assert sample_value(relay.metrics, "relay_database_errors_total") >= 1


def test_stop_drains_confirms_and_releases_what_stays_unconfirmed() -> None:
    store = InMemoryStore()
    fill(store, 4)
    publisher = ScriptedPublisher(lambda row: "ack" if row.id % 2 else None, confirm_timeout=60)
    relay = make(store, publisher)
    ok = run(run_until(relay, lambda: len(publisher.published) == 4))
    assert ok
    assert statuses(store) == {1: SENT, 2: PENDING, 3: SENT, 4: PENDING}
    for id in (2, 4):
        s = store.rows[id]
        assert id not in store.held and s.next_attempt_at == store.clock.now, (
            "not due again at once"
        )
        assert s.row.attempts == 0 and s.row.last_error == "lost: publisher closed"


def test_a_batch_is_claimed_ahead_of_the_window_and_released_when_publishing_stops() -> None:
    store = InMemoryStore()
    fill(store, 30)
    publisher = ScriptedPublisher(lambda row: None, window=10, confirm_timeout=60)  # silent
    relay = make(store, publisher, batch_size=5)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        await wait(lambda: len(publisher.published) == 10 and len(store.held) == 15)
        # Each turn wakes the claims (``Relay.wake``); the next turn starts only once the
        # loop has nothing left to do, a claim included: two turns on, the relay has
        # decided at least once more whether to claim.
        turns = store.calls["turn"]
        await wait(lambda: store.calls["turn"] >= turns + 2)
        assert len(store.held) == 15, "claimed more than one batch ahead"
        publisher.connected = False  # the broker went away: the ready batch goes back
        await wait(lambda: store.held == set(range(1, 11)))
        for id in range(11, 16):
            s = store.rows[id]
            assert s.next_attempt_at == store.clock.now and s.row.attempts == 0, "not due at once"
            assert s.row.last_error == f"lost: {RELEASED}"
        publisher.connected = True
        await wait(lambda: len(store.held) == 15)  # a batch ahead again
        relay.stop()
        assert await task
        assert not store.held, "a row stayed held after the relay stopped"

    run(scenario())


def test_a_relay_the_schema_retires_stops_drains_and_says_which_release_to_run() -> None:
    """A migration raised the least protocol mid-stream: at its next turn the relay claims
    nothing more, sends back what it claimed ahead, settles the confirms it waits for, and
    ``run`` raises the error naming the release (the daemon exits with that line)."""
    store = InMemoryStore()
    fill(store, 30)
    publisher = ScriptedPublisher(lambda row: "ack", window=10, answer_after=0.5)
    relay = make(store, publisher, batch_size=5)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        await wait(lambda: len(publisher.published) == 10 and len(store.held) == 15)
        store.admits[PROTOCOL + 1] = "outbox-relay 9.0"  # before the broker answers
        with pytest.raises(RetiredError, match=r"run outbox-relay 9\.0 or later$"):
            await task

    run(scenario())
    assert len(publisher.published) == 10, "published after the schema retired it"
    assert not store.held, "a row stayed held after the relay stopped"
    assert statuses(store) == {i: SENT if i <= 10 else PENDING for i in range(1, 31)}
    assert sample_value(relay.metrics, "relay_fenced") == 1


class TurnsFail(InMemoryStore):
    """A store whose turns fail while ``turns_fail`` (its claims and settles still work)."""

    turns_fail = False

    def turn(self, active: bool = True) -> float:
        if self.turns_fail:
            raise StoreError("turn failed (simulated)")
        return super().turn(active)


def test_a_relay_that_cannot_renew_its_lease_publishes_nothing_once_it_runs_short() -> None:
    """Its turns fail (as after a freeze, or with the database half away): before its
    lease has less than the margin left, it stops claiming, releases the batch it claimed
    ahead unpublished, and publishes nothing more, until a turn renews the lease."""
    store = TurnsFail(lease=60.0)
    fill(store, 30)
    publisher = ScriptedPublisher(lambda row: None, window=10, confirm_timeout=300)  # silent
    relay = make(store, publisher, batch_size=5, lease_margin=1.0)
    ahead = range(11, 16)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        await wait(lambda: len(publisher.published) == 10 and len(store.held) == 15)
        store.turns_fail = True
        released = f"lost: {LEASE_SHORT}"
        await wait(lambda: all(store.rows[i].row.last_error == released for i in ahead), 120)
        assert relay.lease.left() <= relay.lease.margin
        assert relay.lease.left() > 0, "released only when the lease had run out"
        await asyncio.sleep(30)
        assert len(publisher.published) == 10, "published with its lease running out"
        assert store.held == set(range(1, 11)), "claimed with its lease running out"
        store.turns_fail = False
        await wait(lambda: len(store.held) == 15, 10)  # renewed: a batch claimed ahead again
        relay.stop()
        await task

    run(scenario())


def test_a_relay_whose_turns_fail_is_not_ready_saying_why_though_its_claims_work() -> None:
    """Its claims and settles work (their success said it ready again): it is not ready while
    its turns fail, with their error, nor said available; ready once a turn works."""
    store = TurnsFail()
    publisher = ScriptedPublisher(lambda row: "ack")
    relay = make(store, publisher)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        await wait(relay.ready)
        store.turns_fail = True
        await wait(lambda: not relay.ready())
        fill(store, 5)
        await wait(lambda: set(statuses(store).values()) == {SENT})  # claimed and settled
        errors = sample_value(relay.metrics, "relay_database_errors_total")
        ready_between = False
        while sample_value(relay.metrics, "relay_database_errors_total") < errors + 4:
            ready_between |= relay.ready()  # claims (polls) work between the failed turns
            await asyncio.sleep(0.001)
        assert not ready_between
        assert relay.unready() == "the database's turns fail: turn failed (simulated)"
        assert sample_value(relay.metrics, "relay_database_connected") == 0
        store.turns_fail = False
        await wait(relay.ready)
        assert sample_value(relay.metrics, "relay_database_connected") == 1
        relay.stop()
        await task

    run(scenario())


class SettlesBreak(InMemoryStore):
    """A store whose settle fails with an error no retry catches (a fault in the relay's own
    code, say), while its claims and turns go on working."""

    def settle(self, batch: SettleBatch) -> None:
        raise RuntimeError("settle broke (simulated)")


def test_a_relay_whose_settle_task_dies_fails_at_once_rather_than_stay_ready() -> None:
    """The loop lives by its settle task: once that task died, nothing acked would be marked
    sent, while claims, turns and /readyz went on as if all were well. The relay fails with
    the task's own error, within a turn of its loop."""
    store = SettlesBreak()
    fill(store, 5)
    publisher = ScriptedPublisher(lambda row: "ack")
    relay = make(store, publisher)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        await wait(task.done, 10)
        with pytest.raises(RuntimeError, match="settle broke"):
            task.result()

    run(scenario())
    assert len(publisher.published) == 5
    assert set(statuses(store).values()) == {PENDING}, "nothing recorded: due again"


def test_a_relay_waiting_on_a_protocol_fence_is_ready() -> None:
    """Its turns work: it is ready, so that a rollout goes on and stops the older relays it
    waits for."""
    store = InMemoryStore()
    older = InMemoryStore("older", clock=store.clock, protocol=None)
    older.rows, older.buckets, older.relays = store.rows, store.buckets, store.relays
    older.turn()
    publisher = ScriptedPublisher(lambda row: "ack")
    relay = make(store, publisher)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        await wait(lambda: sample_value(relay.metrics, "relay_fenced") == 1)
        assert relay.ready()
        relay.stop()
        await task

    run(scenario())


def test_a_relay_the_broker_blocks_is_not_ready_saying_why() -> None:
    """Connected, a confirm channel open, but the broker's resource alarm holds every publish:
    the relay publishes nothing, so it is not ready (a rollout waits) until the alarm ends,
    and it publishes the rows written meanwhile then."""
    store = InMemoryStore()
    publisher = ScriptedPublisher(lambda row: "ack")
    relay = make(store, publisher)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        await wait(relay.ready)
        publisher.blocked = True
        assert relay.unready() == (
            "the broker blocks publishing: a resource alarm (see the broker_blocked log lines)"
        )
        fill(store, 5)
        publisher.blocked = False
        relay.wake()
        await wait(lambda: set(statuses(store).values()) == {SENT})
        assert relay.ready()
        relay.stop()
        await task

    run(scenario())


def acked_order(ordered: bool) -> dict[str, list[int]]:
    """Rows of three keys, interleaved; the first attempt of each key's first row is nacked.
    Returns, per key, the ids in the order the broker acked them."""
    store = InMemoryStore(ordered=ordered)
    keys = ["a", "b", "c"] * 10
    store.enqueue([NewMessage(k.encode(), "ex", ordering_key=k) for k in keys])
    first_rows = {1, 2, 3}
    acked: dict[str, list[int]] = {}

    def respond(row: OutboxRow) -> str:
        if row.id in first_rows and row.attempts == 0:
            return "nack"
        acked.setdefault(row.payload.decode(), []).append(row.id)
        return "ack"

    relay = make(store, ScriptedPublisher(respond, window=8), max_attempts=5)

    def all_sent() -> bool:
        store.clock.advance(1)  # let retries come due
        return set(statuses(store).values()) == {SENT}

    assert run(run_until(relay, all_sent))
    return acked


def test_ordering_keeps_each_keys_rows_in_id_order_across_retries() -> None:
    ordered = acked_order(ordered=True)
    assert {k: v == sorted(v) and len(v) == 10 for k, v in ordered.items()} == {
        "a": True,
        "b": True,
        "c": True,
    }
    # The same run without ordering lets later rows overtake the retried ones.
    unordered = acked_order(ordered=False)
    assert any(v != sorted(v) for v in unordered.values())


def test_the_byte_budget_bounds_what_the_relay_holds_and_a_big_row_goes_alone() -> None:
    """Rows held (claimed and not settled) never add up to more than the budget, but for a
    row larger than the whole budget, which is claimed and published alone."""
    store = InMemoryStore()
    sizes = [400] * 10 + [5000] + [400] * 5
    store.enqueue([NewMessage(b"x" * n, "ex", "rk") for n in sizes])
    held: list[list[int]] = []
    claim = store.claim

    def watched(
        limit: int, max_bytes: int, first_always: bool = False, skip: Collection[str] = ()
    ) -> list[OutboxRow]:
        rows = claim(limit, max_bytes, first_always, skip)
        held.append([store.rows[i].row.size for i in store.held])
        return rows

    store.claim = watched  # type: ignore[method-assign]
    publisher = ScriptedPublisher(lambda row: "ack", window=100)
    relay = make(store, publisher, max_inflight_bytes=2000)
    assert run(run_until(relay, lambda: set(statuses(store).values()) == {SENT}))
    assert [r.size for r in publisher.published] == sizes
    over = [h for h in held if sum(h) > 2000]
    assert over == [[5000]], f"held more than the budget: {over}"
    assert max(len(h) for h in held) == 5, "the budget was not used"
    assert sample_value(relay.metrics, "relay_held_bytes") == 0


class SlowEmptyClaims(InMemoryStore):
    """A claim that finds nothing comes back only once every row held is settled: the
    settles, beside it in another thread, outrun it, as on a busy database."""

    def __init__(self) -> None:
        super().__init__()
        self.changed = threading.Condition()
        self.slowed = 0

    def claim(
        self, limit: int, max_bytes: int, first_always: bool = False, skip: Collection[str] = ()
    ) -> list[OutboxRow]:
        with self.changed:
            rows = super().claim(limit, max_bytes, first_always, skip)
            if not rows and self.held:
                self.slowed += 1
                assert self.changed.wait_for(lambda: not self.held, timeout=30)
            return rows

    def settle(self, batch: SettleBatch) -> None:
        with self.changed:
            super().settle(batch)
            self.changed.notify_all()

    def enqueue(self, messages: Sequence[NewMessage]) -> list[str]:
        with self.changed:
            return super().enqueue(messages)


def test_a_claim_the_budget_cut_while_settles_freed_everything_held_leaves_claims_going() -> None:
    """Two rows of 300 held, the budget 1,000: the next claim, with 400 of room, finds
    nothing, and the budget is taken to have cut it (a row of half would not fit). Its rows
    are all settled while it runs: the room it waited for is there already, and no settle
    is left to say so. Seen on a busy machine: the relay claimed nothing again, for ever.
    On real time (a virtual clock stands still while a store call runs): the next claim
    starts a poll after the first, the broker answers later."""
    store = SlowEmptyClaims()
    store.enqueue([NewMessage(b"x" * 300, "ex", "rk") for _ in range(2)])
    publisher = ScriptedPublisher(lambda row: "ack", window=100, answer_after=0.5)
    relay = make(store, publisher, max_inflight_bytes=1000)

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        await wait(lambda: store.slowed > 0 and not store.held, timeout=60)
        with store.changed:
            assert set(statuses(store).values()) == {SENT}
        store.enqueue([NewMessage(b"y", "ex", "rk")])
        relay.wake()
        await wait(lambda: len(publisher.published) == 3, timeout=60)
        relay.stop()
        assert await task

    asyncio.run(scenario())


class RefusingPublisher(ScriptedPublisher):
    """A broker that refuses the exchange "gone": the publisher charges its rows an attempt
    without publishing them, as the real one does for a broken destination."""

    def broken_exchanges(self) -> frozenset[str]:
        return frozenset({"gone"})

    def publish(self, rows: Sequence[OutboxRow]) -> None:
        for row in rows:
            if row.exchange == "gone":
                self.tracker.fail(row, "the broker refuses exchange 'gone'")
        super().publish([r for r in rows if r.exchange != "gone"])


def test_claims_leave_a_broken_exchange_for_last_while_other_rows_wait() -> None:
    store = InMemoryStore()
    store.enqueue([NewMessage(b"x", "gone" if i % 2 else "ex") for i in range(400)])
    claims: list[tuple[float, Collection[str], list[str]]] = []
    claim = store.claim

    def watched(
        limit: int, max_bytes: int, first_always: bool = False, skip: Collection[str] = ()
    ) -> list[OutboxRow]:
        rows = claim(limit, max_bytes, first_always, skip)
        claims.append((loop.time(), skip, [r.exchange for r in rows]))
        return rows

    store.claim = watched  # type: ignore[method-assign]
    relay = make(store, RefusingPublisher(lambda row: "ack", window=50), max_attempts=1)
    loop = VirtualTimeLoop()
    started = loop.time()
    assert run(
        run_until(relay, lambda: sorted(set(statuses(store).values())) == [PARKED, SENT]), loop
    )
    good_claimed = max(i for i, (_, _, ex) in enumerate(claims) if "ex" in ex)
    while_waiting = claims[: good_claimed + 1]
    assert all(skip == {"gone"} for _, skip, _ in while_waiting[1:] if skip)
    # Besides the first claim (nothing was broken yet), one a HELD_CHARGE_INTERVAL_S at most.
    unskipped = [at for at, skip, _ in while_waiting[1:] if not skip]
    assert len(unskipped) <= (while_waiting[-1][0] - started) / HELD_CHARGE_INTERVAL_S + 1
    assert {s.row.exchange for s in store.rows.values() if s.status == PARKED} == {"gone"}


class Watched(InMemoryStore):
    """A store that records when (on ``loop``'s clock: its calls run in worker threads)
    each claim and settle ran, and how many rows each took; and that rows can be enqueued
    into while the relay runs (its calls and the test's take turns)."""

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self.loop = loop
        self.claims: list[tuple[float, int]] = []
        self.settles: list[tuple[float, int]] = []
        self.lock = threading.Lock()

    def claim(
        self, limit: int, max_bytes: int, first_always: bool = False, skip: Collection[str] = ()
    ) -> list[OutboxRow]:
        with self.lock:
            rows = super().claim(limit, max_bytes, first_always, skip)
        self.claims.append((self.loop.time(), len(rows)))
        return rows

    def settle(self, batch: SettleBatch) -> None:
        with self.lock:
            super().settle(batch)
        self.settles.append((self.loop.time(), len(batch.sent) + len(batch.changes)))

    def enqueue(self, messages: Sequence[NewMessage]) -> list[str]:
        with self.lock:
            return super().enqueue(messages)

    def all_sent(self) -> bool:
        with self.lock:
            return set(statuses(self).values()) == {SENT}


def stream(
    linger: float, every: float, seconds: float, answer_after: float = 0.0
) -> tuple[Watched, dict[str, float]]:
    """A row every ``every`` seconds for ``seconds``, each announced at once (as the probe of
    new rows would, wake for wake), relayed with ``linger``, the broker answering each
    publish ``answer_after`` seconds later; the store, and each row's delay from its commit
    to its publish."""
    loop = VirtualTimeLoop()
    store = Watched(loop)
    publisher = ScriptedPublisher(lambda row: "ack", window=1000, answer_after=answer_after)
    # The defaults' polls and turns: a few a stream (each may claim).
    relay = make(
        store,
        publisher,
        batch_size=500,
        linger=linger,
        poll_interval=POLL_INTERVAL_S,
        turn_interval=TURN_INTERVAL_MAX_S,
    )
    committed: dict[str, float] = {}
    published: dict[str, float] = {}
    publish = publisher.publish

    def watched(rows: Sequence[OutboxRow]) -> None:
        published.update({r.message_id: loop_time() for r in rows if r.message_id not in published})
        publish(rows)

    publisher.publish = watched  # type: ignore[method-assign]

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        for _ in range(round(seconds / every)):
            (message_id,) = store.enqueue([NewMessage(b"x", "ex", "rk")])
            committed[message_id] = loop_time()
            relay.wake()
            await asyncio.sleep(every)
        await wait(store.all_sent)
        relay.stop()
        assert await task

    run(scenario(), loop)
    return store, {i: published[i] - committed[i] for i in committed}


def test_a_steady_stream_is_claimed_and_settled_once_a_linger_however_fast_it_comes() -> None:
    """Rows every 2 ms for 2 s, each announced: with a 50 ms linger, no claim follows a
    short one sooner than 50 ms after it began, settles gather as long, and no row waits more
    than a linger for its claim. Without it, each announcement was a claim of a row or two."""
    store, delays = stream(linger=0.05, every=0.002, seconds=2.0)
    starts = [at for at, _ in store.claims]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.05 - 1e-9, "a claim came sooner than the linger after a short one"
    assert len(store.claims) <= 2.0 / 0.05 + 3
    assert len(store.settles) <= 2.0 / 0.05 + 3
    assert max(delays.values()) <= 0.05 + 0.002, "a row waited longer than a linger"
    eager, _ = stream(linger=0.0, every=0.002, seconds=2.0)
    assert len(eager.claims) > 5 * len(store.claims)


def test_without_a_linger_each_new_row_is_claimed_at_once_by_one_claim() -> None:
    """RELAY_LINGER=0 claims every new row at once: a row every 10 ms, each announced (as
    the probe announces the newest id's change), the broker answering in 3 ms. Each row is
    published as it is announced, by the one claim its announcement asked for; no claim
    comes back empty but a poll's. (Every turn of the loop claimed once a claim had found
    rows within a poll interval: its publish's confirm and its settle each turned the loop,
    three claims a row, two of them empty.)"""
    seconds, every = 2.0, 0.01
    store, delays = stream(linger=0.0, every=every, seconds=seconds, answer_after=0.003)
    rows = len(delays)
    unasked = seconds / POLL_INTERVAL_S + seconds / TURN_INTERVAL_MAX_S + 2  # polls, turns
    assert max(delays.values()) < every / 2, "a row waited for its claim"
    empty = [at for at, n in store.claims if n == 0]
    assert len(empty) <= unasked, f"{len(empty)} empty claims for {rows} rows"
    assert len(store.claims) <= rows + unasked


def test_a_backlog_is_claimed_and_settled_without_lingering() -> None:
    """Full claims follow each other at once, and a batch's worth of outcomes is settled at
    once: a 1,000-row backlog drains in no (virtual) time, not a linger per batch."""
    loop = VirtualTimeLoop()
    store = Watched(loop)
    fill(store, 1000)
    relay = make(store, ScriptedPublisher(lambda row: "ack", window=100), batch_size=50, linger=0.5)

    async def scenario() -> float:
        task = asyncio.create_task(relay.run())
        await wait(lambda: set(statuses(store).values()) == {SENT})
        drained = loop_time()
        relay.stop()
        assert await task
        return drained

    assert run(scenario(), loop) < 0.5
    assert all(n == 50 for _, n in store.claims[:20]), "the backlog's claims were not full"
    assert max(n for _, n in store.settles) >= 50


def test_the_probe_listens_only_while_the_relay_is_idle() -> None:
    """``idle`` is set while the last claim found nothing (the probe of new rows looks only
    then), and cleared while claims find rows (they look for the stream themselves)."""
    store = InMemoryStore()
    relay = make(store, ScriptedPublisher(lambda row: "ack"), linger=0.05)
    seen: list[bool] = []

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        await wait(lambda: bool(store.held) or relay.idle.is_set())
        seen.append(relay.idle.is_set())
        fill(store, 5)
        relay.wake()
        await wait(lambda: not relay.idle.is_set())
        seen.append(relay.idle.is_set())
        await wait(relay.idle.is_set)  # the next claim, a linger later, finds none
        seen.append(relay.idle.is_set())
        relay.stop()
        assert await task

    run(scenario())
    assert seen == [True, False, True]


def test_two_relays_without_a_linger_claim_each_new_row_once_between_them() -> None:
    """Every relay's probe sees every commit (the newest id), but a row lies in one relay's
    buckets: a relay claims only for new ids that may lie in its own. Two relays woken for
    every row made a claim each per row, one of them empty."""
    loop = VirtualTimeLoop()
    shared = Watched(loop)
    stores = [Watched(loop), Watched(loop)]
    for owner, store in zip(("a", "b"), stores, strict=True):
        store.owner, store.clock = owner, shared.clock
        store.rows, store.buckets, store.relays = shared.rows, shared.buckets, shared.relays
        store.protocols, store.admits, store.lock = shared.protocols, shared.admits, shared.lock
    relays = [
        make(
            s,
            ScriptedPublisher(lambda row: "ack", answer_after=0.003),
            poll_interval=POLL_INTERVAL_S,
            turn_interval=TURN_INTERVAL_MAX_S,
        )
        for s in stores
    ]
    rows = 200

    async def scenario() -> None:
        tasks = [asyncio.create_task(r.run()) for r in relays]
        await wait(lambda: all(s.held == set() for s in stores))
        for s in stores:  # the buckets shared out, as the relays' turns do
            s.turn()
        for s in stores:
            s.turn()
        newest = max(shared.rows, default=0)
        for _ in range(rows):
            # A row every 10 ms, ids in runs of the span: the two relays' buckets take turns.
            message = NewMessage(b"x", "ex", "rk")
            (_,) = shared.enqueue([message])
            for relay in relays:
                relay.new_rows(newest, newest + 1)  # what each relay's probe says
            newest += 1
            await asyncio.sleep(0.01)
        await wait(shared.all_sent)
        for relay in relays:
            relay.stop()
        assert all([await t for t in tasks])

    run(scenario(), loop)
    claims = [n for s in stores for _, n in s.claims]
    unasked = 2 * (rows * 0.01 / POLL_INTERVAL_S + rows * 0.01 / TURN_INTERVAL_MAX_S + 3)
    assert claims.count(0) <= unasked, f"{claims.count(0)} empty claims for {rows} rows"
    assert sum(claims) == rows


def test_without_a_linger_the_probe_listens_while_rows_flow() -> None:
    """No claim looks for the stream unasked without a linger: the probe must, so ``idle``
    stays set while claims find rows."""
    store = InMemoryStore()
    relay = make(store, ScriptedPublisher(lambda row: "ack"), linger=0.0)
    listening: list[bool] = []

    async def scenario() -> None:
        task = asyncio.create_task(relay.run())
        for _ in range(5):
            fill(store, 3)
            relay.wake()
            await wait(lambda: set(statuses(store).values()) == {SENT})
            listening.append(relay.idle.is_set())
        relay.stop()
        assert await task

    run(scenario())
    assert listening == [True] * 5


def one_keys_rows_sent_after(ordering: bool, linger: float = 0.05) -> float:
    """Seconds (virtual) until 20 rows of one ordering key are sent, the broker answering each
    in 10 ms, a poll every half second (the default)."""
    store = InMemoryStore(ordered=True)
    store.enqueue([NewMessage(b"x", "ex", ordering_key="k") for _ in range(20)])
    publisher = ScriptedPublisher(lambda row: "ack", answer_after=0.01)
    relay = make(store, publisher, linger=linger, ordering=ordering, poll_interval=0.5)

    async def scenario() -> float:
        task = asyncio.create_task(relay.run())
        await wait(lambda: set(statuses(store).values()) == {SENT}, 60)
        done = loop_time()
        relay.stop()
        assert await task
        return done

    return run(scenario())


def test_with_ordering_a_keys_rows_advance_one_a_claim_not_one_per_settle_linger() -> None:
    """A key's next row is claimed once its last is settled: with outcomes taken along by the
    very next claim, a key advances a row per linger (20 rows in about a second)."""
    ordered = one_keys_rows_sent_after(ordering=True)
    assert ordered <= 21 * 0.05 + 0.01
    assert one_keys_rows_sent_after(ordering=False) > 1.5 * ordered


def test_with_ordering_and_no_linger_a_keys_rows_advance_at_the_brokers_pace() -> None:
    """Without a linger no claim comes unasked: the settle of a key's row asks for the claim
    of its next (each waited for the poll: 20 rows in 10 s; an outside review's relay moved
    a key a row per half second)."""
    assert one_keys_rows_sent_after(ordering=True, linger=0.0) <= 20 * (0.01 + 0.01)


def test_a_relay_woken_from_a_suspend_past_its_lease_publishes_nothing_it_held() -> None:
    """The lease is carried on a clock that runs on while the machine is suspended
    (``relay.lease.lease_clock``); here the loop's own time stands still through the suspend
    and the lease's jumps. Relay a holds rows in each state that waits: in flight, claimed
    ahead for a full window, and a suspect waiting to go out alone. It sleeps past its
    lease; relay b takes every bucket and claims those rows. Awake, a renews a lease (of no
    bucket), and publishes none of them: the rows claimed ahead go back at once, and the
    suspect, which goes out once the rows in flight are answered, is dropped as claimed under
    a lease that lapsed."""
    db = DatabaseClock()
    a, b = InMemoryStore("a", lease=10.0, clock=db), InMemoryStore("b", lease=10.0, clock=db)
    b.rows, b.buckets, b.relays = a.rows, a.buckets, a.relays
    fill(a, 30)
    a.rows[3].row = a.rows[3].row._replace(suspect=True)
    publisher = ScriptedPublisher(lambda row: "ack", window=10, answer_after=20.0)
    slept = [0.0]
    relay = make(a, publisher, batch_size=5, clock=lambda: loop_time() + slept[0])

    async def scenario() -> tuple[set[int], list[int]]:
        task = asyncio.create_task(relay.run())
        await wait(lambda: len(a.held) == 10 and publisher.tracker.in_flight == 4)
        published = len(publisher.published)
        slept[0] += 60.0  # suspended: the lease's clock and the database's move on
        db.advance(60.0)
        b.turn()
        taken = {r.id for r in b.claim(100, 2**30)}
        await asyncio.sleep(30)  # the answers come, the suspect's turn to go out passes
        relay.stop()
        await task
        return taken, [r.id for r in publisher.published[published:]]

    taken, published_after = run(scenario())
    assert 3 in taken and len(taken) == 30  # rows 1, 2, 4 and 5 went out before the sleep
    assert set(published_after) & taken == set(), "published a row of a lapsed lease"
