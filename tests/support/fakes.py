"""In-memory fakes of the store and the publisher, held to the real ones by contract tests.

The store fake plays every role the outbox has (claims for the loop, enqueue for writers);
the publisher fake shares the real one's confirm window, tracker and quarantine, and scripts
the broker."""

from __future__ import annotations

import asyncio
import collections
import itertools
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from relay.broker.confirms import ConfirmWindow
from relay.broker.quarantine import Quarantine
from relay.buckets import Fence, any_in, bucket_of, fence, retired, turn
from relay.constants import (
    MAX_MESSAGE_SIZE,
    OUTBOX_BUCKETS,
    PROTOCOL,
    PROTOCOL_BEFORE_FENCES,
    PROTOCOL_RELEASE,
)
from relay.errors import StoreError
from relay.lease import LEASE_LAPSED, LEASE_SHORT, Lease, Waiting
from relay.message import Unpublishable, build, too_large_to_read
from relay.records import (
    PENDING,
    SENT,
    BacklogStats,
    NewMessage,
    OutboxRow,
    SettleBatch,
)


@dataclass
class _Stored:
    row: OutboxRow
    status: str
    next_attempt_at: datetime
    sent_at: datetime | None = None
    ordering_key: str | None = None


class DatabaseClock:
    """The fake database's clock: it stands still until a test moves it (``advance``)."""

    def __init__(self) -> None:
        self.now = datetime(2026, 11, 22, tzinfo=UTC)

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class _Bucket:
    owner: str | None = None
    lease_until: datetime | None = None


class InMemoryStore:
    """The outbox as a dict; ``failing`` makes the next calls raise StoreError (an outage).
    Every time is its ``clock``'s, as every time of the real stores is the database's;
    stores that share ``rows`` (and ``buckets``, ``relays``: one outbox) share the clock too.
    ``held``: the rows this relay claimed and has not settled. ``sent_log``: message ids a
    test says were acked before and left the outbox (``keep_sent = ids``): a row written
    with one is claimed ``sent_before``; ``duplicates`` counts those dropped."""

    def __init__(
        self,
        owner: str = "relay-a",
        lease: float = 60.0,
        ordered: bool = False,
        clock: DatabaseClock | None = None,
        *,
        margin: float = 0.0,
        max_message_size: int = MAX_MESSAGE_SIZE,
        protocol: int | None = PROTOCOL,
    ):
        self.owner = owner
        self.protocol = protocol
        self.fenced: Fence | None = None
        self.lease = timedelta(seconds=lease)
        self.margin = timedelta(seconds=margin)
        self.max_message_size = max_message_size
        self.ordered = ordered
        self.clock = clock or DatabaseClock()
        self.rows: dict[int, _Stored] = {}
        self.buckets = {b: _Bucket() for b in range(OUTBOX_BUCKETS)}
        self.relays: dict[str, datetime] = {}  # owner -> alive until
        self.protocols: dict[str, int] = {}  # owner -> its protocol
        # The schema's least protocol -> the release that first speaks it (outbox_protocol).
        self.admits: dict[int, str] = {PROTOCOL_BEFORE_FENCES: "any release"}
        self.held: set[int] = set()
        self.sent_log: set[str] = set()
        self.duplicates = 0
        self._claim_from: frozenset[int] = frozenset()
        self.failing = False
        # Calls made, by name (``turn``, ``claim``, ...), and those refused while failing: a
        # test waits on them for proof that the relay had its chance to do something.
        self.calls: collections.Counter[str] = collections.Counter()
        self.refused: collections.Counter[str] = collections.Counter()

    def turn(self, active: bool = True) -> float:
        self._check("turn")
        now = self.clock.now
        self.fenced = self._fence(now) if active and self.protocol is not None else None
        switch = self.fenced is None and self.protocol == PROTOCOL > max(self.admits)
        if active and switch:
            self.admits[PROTOCOL] = PROTOCOL_RELEASE  # the switch (``relay.db.buckets``)
        if active:
            self._present(now if self.fenced else now + self.lease)
        else:
            self.relays.pop(self.owner, None)
        for owner, until in list(self.relays.items()):
            if until < now - self.lease:
                del self.relays[owner]
        live = sum(1 for until in self.relays.values() if until > now)
        owned = set()
        for b, bucket in self.buckets.items():
            if bucket.owner == self.owner:
                bucket.lease_until = now + self.lease
                owned.add(b)
        plan = turn(owned, live, self.held, active and self.fenced is None)
        free = [
            b
            for b, bucket in sorted(self.buckets.items())
            if bucket.owner is None
            or (bucket.lease_until is not None and bucket.lease_until <= now)
        ]
        taken = set(free[: plan.take])
        for b in taken:
            self.buckets[b] = _Bucket(self.owner, now + self.lease)
        for b in plan.release:
            self.buckets[b] = _Bucket()
        self._claim_from = plan.claim_from | taken
        if not active and self.protocol is not None and owned - plan.release:
            self._present(now)  # present while it holds buckets, not counted
        if self.fenced is Fence.RETIRED:
            least = max(self.admits)
            raise retired(self.protocol, least, self.admits[least])
        return self.lease.total_seconds()

    def _present(self, until: datetime) -> None:
        self.relays[self.owner] = until
        if self.protocol is not None:
            self.protocols[self.owner] = self.protocol

    def _fence(self, now: datetime) -> Fence | None:
        """``relay.db.buckets.refresh``'s look at the other relays' protocols: of those that
        hold buckets, present or not (one not present is of protocol 1), of those present,
        and of those counted among the relays."""
        assert self.protocol is not None
        others = {o: until for o, until in self.relays.items() if o != self.owner}
        holding = {
            self.protocols.get(b.owner, PROTOCOL_BEFORE_FENCES)
            if b.owner in others
            else PROTOCOL_BEFORE_FENCES
            for b in self.buckets.values()
            if b.owner not in (None, self.owner)
            and b.lease_until is not None
            and b.lease_until > now
        }
        announced = {
            self.protocols.get(o, PROTOCOL_BEFORE_FENCES)
            for o, until in others.items()
            if until > now - self.lease
        }
        counted = {
            self.protocols.get(o, PROTOCOL_BEFORE_FENCES)
            for o, until in others.items()
            if until > now
        }
        return fence(self.protocol, holding, announced, max(self.admits), counted)

    def may_hold(self, first: int, last: int) -> bool:
        return any_in(first, last, self._claim_from)

    def _owns(self, row_id: int, *, leased: bool = True) -> bool:
        """The row's bucket is this relay's: under a lease with more than the margin left, or
        with ``leased=False`` whatever its lease (taken by no one since)."""
        bucket = self.buckets[bucket_of(row_id)]
        return bucket.owner == self.owner and (
            not leased
            or (
                bucket.lease_until is not None and bucket.lease_until > self.clock.now + self.margin
            )
        )

    def claim(
        self,
        limit: int,
        max_bytes: int,
        first_always: bool = False,
        skip: Collection[str] = (),
    ) -> list[OutboxRow]:
        self._check("claim")
        now = self.clock.now
        first_pending: dict[str, int] = {}
        for s in sorted(self.rows.values(), key=lambda s: s.row.id):
            if s.status == PENDING and s.ordering_key is not None:
                first_pending.setdefault(s.ordering_key, s.row.id)
        due = sorted(
            (
                s
                for s in self.rows.values()
                if s.status == PENDING
                and s.next_attempt_at <= now
                and bucket_of(s.row.id) in self._claim_from
                and self._owns(s.row.id)
                and s.row.id not in self.held
                and s.row.exchange not in skip
                and (
                    not self.ordered
                    or s.ordering_key is None
                    or first_pending[s.ordering_key] == s.row.id
                )
            ),
            key=lambda s: (s.next_attempt_at, s.row.id),
        )[:limit]
        upto = list(itertools.accumulate(0 if self._oversize(s) else s.row.size for s in due))
        due = [s for i, s in enumerate(due) if upto[i] <= max_bytes or (first_always and i == 0)]
        self.held.update(s.row.id for s in due)
        return sorted((self._claimed(s) for s in due), key=lambda r: r.id)

    def _oversize(self, s: _Stored) -> int | None:
        size = s.row.size + len((s.row.headers or "").encode())
        return size if size > self.max_message_size else None

    def _claimed(self, s: _Stored) -> OutboxRow:
        """The row as a claim returns it: an oversized one unread (``relay.db.due``)."""
        row = s.row._replace(sent_before=s.row.message_id in self.sent_log)
        if (size := self._oversize(s)) is None:
            return row
        reason = too_large_to_read(size, self.max_message_size)
        return row._replace(payload=b"", headers=None, unreadable=reason)

    def settle(self, batch: SettleBatch) -> None:
        self._check("settle")
        now = self.clock.now
        for id in batch.sent:
            s = self.rows[id]
            if s.status == PENDING:
                s.status, s.sent_at = SENT, now
        for c in batch.changes:
            s = self.rows[c.id]
            if s.status == PENDING and self._owns(c.id, leased=False):
                s.status = c.status
                s.next_attempt_at = now + timedelta(seconds=c.delay)
                s.row = s.row._replace(
                    attempts=c.attempts, last_error=c.last_error, suspect=c.suspect
                )
        for id in batch.duplicates:
            if id in self.rows and self.rows[id].status == PENDING:
                del self.rows[id]
                self.duplicates += 1
        self.held.difference_update(batch.sent)
        self.held.difference_update(c.id for c in batch.changes)
        self.held.difference_update(batch.duplicates)

    def hasten(self, exchanges: Sequence[str]) -> int:
        self._check("hasten")
        now = self.clock.now
        waiting = [
            s
            for s in self.rows.values()
            if s.status == PENDING
            and s.row.exchange in exchanges
            and s.row.attempts > 0
            and s.next_attempt_at > now
        ]
        for s in waiting:
            s.next_attempt_at = now
        return len(waiting)

    def backlog(self) -> BacklogStats:
        self._check("backlog")
        now = self.clock.now
        due = [s for s in self.rows.values() if s.status == PENDING and s.next_attempt_at <= now]
        oldest = min((s.next_attempt_at for s in due), default=now)
        return BacklogStats(len(due), (now - oldest).total_seconds())

    def enqueue(self, messages: Sequence[NewMessage]) -> list[str]:
        self._check("enqueue")
        now = self.clock.now
        ids = []
        # Looked up once per call, not per row: per row, 10,050 rows took a minute.
        known = {s.row.message_id for s in self.rows.values()}
        last = max(self.rows, default=0)
        for m in messages:
            message_id = m.message_id or str(uuid.uuid4())
            if message_id in known:
                raise StoreError(f"duplicate message_id {message_id}")
            known.add(message_id)
            # Ids from the shared table, as a database sequence would give them.
            last += 1
            row = OutboxRow(
                last,
                message_id,
                m.exchange,
                m.routing_key,
                m.payload,
                m.content_type,
                m.headers,
                now,
                0,
            )
            self.rows[row.id] = _Stored(row, PENDING, now, ordering_key=m.ordering_key)
            ids.append(message_id)
        return ids

    def close(self) -> None:
        self.turn(active=False)

    def _check(self, call: str) -> None:
        self.calls[call] += 1
        if self.failing:
            self.refused[call] += 1
            raise StoreError("database is down (simulated)")


def lasting_lease() -> Lease:
    """A lease that always holds, for a publisher tested on other things."""
    lease = Lease(0.0, lambda: 0.0)
    lease.renewed(float("inf"))
    return lease


Responder = Callable[[OutboxRow], str | None]  # "ack", "nack", "return" or None (silence)


class ScriptedPublisher(ConfirmWindow):
    """A broker that answers each publish as ``respond`` says, asynchronously, in order; it
    takes every exchange. Suspects go out alone, as the real publisher sends them."""

    def __init__(
        self,
        respond: Responder,
        window: int = 100,
        confirm_timeout: float = 5.0,
        lease: Lease | None = None,
        answer_after: float = 0.0,
    ):
        """``answer_after``: seconds the broker takes to answer each publish."""
        super().__init__(window, confirm_timeout)
        self.answer_after = answer_after
        self.lease = lease or lasting_lease()  # suspects wait under it, as the real one's
        self.respond = respond
        self.published: list[OutboxRow] = []
        self.max_in_flight = 0
        self._connected = True
        self.blocked = False  # the broker's resource alarm: connected, publishing nothing
        self._quarantine = Quarantine()
        self._wake: Callable[[], None] = lambda: None
        self._answered: Callable[[], None] = lambda: None
        self._closed = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self._connected

    @connected.setter
    def connected(self, value: bool) -> None:
        self._connected = value

    @property
    def can_publish(self) -> bool:
        return self.connected and not self.blocked

    def capacity(self) -> int:
        return 0 if self._quarantine.closed else super().capacity()

    @property
    def lease(self) -> Lease:
        return self._lease

    @lease.setter
    def lease(self, lease: Lease) -> None:
        self._lease = lease
        self._waiting = Waiting(lease)

    def publish(self, rows: Sequence[OutboxRow]) -> None:
        for row in rows:
            if not self.connected:
                self.tracker.lose([row], "no channel to publish on")
            elif self._quarantine.admit(row):
                self._send(row)
            else:
                self._waiting.wait(row)
        self._release_alone()
        if self.tracker.answered:
            self._wake()

    def _release_alone(self) -> None:
        """The next suspect out alone, if nothing is in flight (one that cannot go out is
        settled at once, and the next one tried), as the real publisher does."""
        while alone := self._quarantine.next_alone(self.tracker.in_flight):
            if self._send(alone):
                return
            self._quarantine.answered()

    def _send(self, row: OutboxRow) -> bool:
        """Publish ``row``; False if it was settled at once instead."""
        if not self.lease.holds():
            self.tracker.lose([row], LEASE_SHORT)
            return False
        if self._waiting.lapsed([row])[1]:
            self.tracker.lose([row], LEASE_LAPSED)
            return False
        try:
            build(row)  # what the real publisher refuses to send, this one refuses too
        except Unpublishable as exc:
            self.tracker.reject(row, str(exc))
            return False
        seq = self.sent(row, asyncio.get_running_loop().time())
        self.published.append(row)
        self.max_in_flight = max(self.max_in_flight, self.tracker.in_flight)
        answer = self.respond(row)
        if answer is not None:
            loop = asyncio.get_running_loop()
            loop.call_later(self.answer_after, self._answer, seq, row, answer)
        return True

    def _answer(self, seq: int, row: OutboxRow, answer: str) -> None:
        if answer == "return":
            self.tracker.on_return(row.message_id, "312 NO_ROUTE")
        if answer == "nack":
            self.tracker.on_nack(seq, False, asyncio.get_running_loop().time())
        else:
            self.tracker.on_ack(seq, False, asyncio.get_running_loop().time())
        if not self.tracker.in_flight:
            self._quarantine.answered()
            self._release_alone()
        self._answered()

    async def run(
        self, wake: Callable[[], None], answered: Callable[[], None] | None = None
    ) -> None:
        self._wake = wake
        self._answered = answered or wake
        while not self._closed.is_set():
            await asyncio.sleep(0.01)
            if self.tracker.expire(asyncio.get_running_loop().time()):
                wake()

    async def close(self) -> None:
        self._closed.set()
        self.tracker.channel_lost("publisher closed")
        self._waiting.forget_all()
        self.tracker.lose(self._quarantine.release(), "publisher closed")
