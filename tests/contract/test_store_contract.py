"""One contract, four stores: the in-memory fake, SQLite, PostgreSQL and MariaDB behave alike.

If the fake drifts from the real stores, these tests fail for the fake, so the loop tests
that use it keep telling the truth. Every time is the store's own (the database's clock): the
tests move it with ``advance``, which the real stores play by moving every stored time back."""

from __future__ import annotations

import json
import random
import string
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from relay.buckets import Fence
from relay.constants import (
    BACKLOG_EXACT_ROWS,
    CAUSE_MAX_CHARS,
    ORDERED_LOOK_ALL_S,
    ORDERED_LOOK_PER_ROW,
    OUTBOX_BUCKETS,
    PROTOCOL,
)
from relay.db.buckets import refresh
from relay.db.claims import ClaimStore
from relay.db.clock import database_time
from relay.db.dialects import of
from relay.db.outbox import OutboxWriter
from relay.db.schema import outbox, outbox_buckets, outbox_protocol, outbox_relays, outbox_sent
from relay.errors import RetiredError
from relay.records import (
    KEEP_IDS,
    KEEP_MESSAGES,
    PARKED,
    PENDING,
    SENT,
    NewMessage,
    RowChange,
    SettleBatch,
)
from tests.support.fakes import DatabaseClock, InMemoryStore

_TIMES = {
    outbox: (outbox.c.created_at, outbox.c.next_attempt_at, outbox.c.sent_at),
    outbox_buckets: (outbox_buckets.c.lease_until,),
    outbox_relays: (outbox_relays.c.alive_until,),
}


class SqlStore(ClaimStore):
    """The relay's claim store with a writer beside it: the contract drives both roles, as
    the in-memory fake (the whole outbox) plays both."""

    def __init__(self, url: str, owner: str, lease: float, **options: Any) -> None:
        super().__init__(url, owner, lease, **options)
        self.writer = OutboxWriter(url)

    def enqueue(self, messages: list[NewMessage]) -> list[str]:
        return self.writer.enqueue(messages)

    def advance(self, seconds: float) -> None:
        """As if the database's clock moved ``seconds`` on: every stored time moves back."""
        fmt, by = "%Y-%m-%d %H:%M:%f000", f"{-seconds:.6f} seconds"
        with self.writer.engine.begin() as conn:
            for table, times in _TIMES.items():
                if self.engine.dialect.name == "postgresql":
                    interval = sa.func.make_interval(0, 0, 0, 0, 0, 0, seconds)
                    back = {c.name: c - interval for c in times}
                elif self.engine.dialect.name == "mysql":
                    micro = sa.text("MICROSECOND")
                    back = {
                        c.name: sa.func.timestampadd(micro, round(-seconds * 1e6), c) for c in times
                    }
                else:
                    back = {c.name: sa.func.strftime(fmt, c, by) for c in times}
                conn.execute(sa.update(table).values(back))

    def close(self) -> None:
        super().close()
        self.writer.close()


LEASE = 60.0
NO_BYTE_LIMIT = 2**62
# Real databases' clocks run on while a test runs: a margin for the time its statements take.
SLACK = 5.0
# (owner, ordered=False, margin=0.0, max_message_size=MAX_MESSAGE_SIZE)
StoreFactory = Callable[..., "InMemoryStore | SqlStore"]


# Cases some stores do not have (``applies``: deselected there, not skipped). The fake's
# settle is atomic (no claim runs inside it) and it reads every row (no front of a backlog);
# SQLite has one writer at a time (no row locks for a turn to skip).
SQL_STORES = pytest.mark.applies.with_args(lambda params: params["make_store"] != "memory")
ROW_LOCKS = pytest.mark.applies.with_args(
    lambda params: params["make_store"] not in ("memory", "sqlite")
)


@pytest.fixture(params=["memory", "sqlite", "postgresql", f"postgresql-{KEEP_MESSAGES}", "mariadb"])
def make_store(request: pytest.FixtureRequest) -> Iterator[StoreFactory]:
    """Returns a factory: owner -> a store on the same outbox, which has had its first turn
    (as a relay has when it starts). The SQL stores delete acked rows into the sent log (the
    default), or with ``-messages`` keep them whole."""
    made: list[SqlStore] = []
    if request.param == "memory":
        shared, clock = InMemoryStore(), DatabaseClock()

        def memory(owner: str, ordered: bool = False, **options: Any) -> InMemoryStore:
            store = InMemoryStore(owner, LEASE, ordered, clock, **options)
            store.rows, store.buckets, store.relays = shared.rows, shared.buckets, shared.relays
            store.protocols, store.admits = shared.protocols, shared.admits
            store.turn()
            return store

        yield memory
        return
    database, _, keep_sent = request.param.partition("-")
    url = request.getfixturevalue(f"{database}_url")

    def sql(owner: str, ordered: bool = False, **options: Any) -> SqlStore:
        keep = keep_sent or KEEP_IDS
        made.append(SqlStore(url, owner, LEASE, ordered=ordered, keep_sent=keep, **options))
        made[-1].turn()
        return made[-1]

    yield sql
    for store in made:
        store.close()


def state(store: InMemoryStore | SqlStore, id: int) -> tuple[str, int, str | None]:
    if isinstance(store, InMemoryStore):
        s = store.rows[id]
        return s.status, s.row.attempts, s.row.last_error
    with store.engine.connect() as conn:
        r = conn.execute(
            sa.select(outbox.c.status, outbox.c.attempts, outbox.c.last_error).where(
                outbox.c.id == id
            )
        ).one_or_none()
        logged = conn.execute(sa.select(outbox_sent.c.id).where(outbox_sent.c.id == id)).all()
    if store.keep_sent == KEEP_IDS:
        assert r is None or r.status != SENT, "a sent row left in the outbox"
    if r is None:
        assert logged, f"row {id} neither in the outbox nor in the sent log"
        return SENT, 0, None
    assert not logged, f"row {id} in the sent log and the outbox"
    return r.status, r.attempts, r.last_error


def msgs(n: int) -> list[NewMessage]:
    return [
        NewMessage(f"body {i}".encode(), "ex", f"rk.{i}", "text/plain", json.dumps({"n": i}))
        for i in range(n)
    ]


def advance(store: InMemoryStore | SqlStore, seconds: float) -> None:
    if isinstance(store, InMemoryStore):
        store.clock.advance(seconds)
    else:
        store.advance(seconds)


def owned(store: InMemoryStore | SqlStore, owner: str) -> int:
    """The buckets ``owner`` holds under a live lease, as ``store`` sees the outbox."""
    if isinstance(store, InMemoryStore):
        now = store.clock.now
        return sum(
            1
            for b in store.buckets.values()
            if b.owner == owner and b.lease_until is not None and b.lease_until > now
        )
    held = sa.select(sa.func.count()).where(
        outbox_buckets.c.owner == owner, outbox_buckets.c.lease_until > database_time()
    )
    with store.writer.engine.connect() as conn:
        return int(conn.execute(held).scalar_one())


def admit(store: InMemoryStore | SqlStore, protocol: int, release: str) -> None:
    """What a migration that older relays cannot run beside does: the schema admits relays
    of ``protocol`` (first spoken by ``release``) or later only."""
    if isinstance(store, InMemoryStore):
        store.admits[protocol] = release
        return
    with store.writer.engine.begin() as conn:
        conn.execute(
            sa.update(outbox_protocol).values(least_protocol=protocol, least_release=release)
        )


def test_claim_returns_due_rows_in_id_order_with_their_fields(make_store: StoreFactory) -> None:
    store = make_store("a")
    ids = store.enqueue(msgs(3))
    rows = store.claim(10, NO_BYTE_LIMIT)
    assert [r.message_id for r in rows] == ids
    assert [r.id for r in rows] == sorted(r.id for r in rows)
    first = rows[0]
    assert (first.exchange, first.routing_key, first.payload) == ("ex", "rk.0", b"body 0")
    assert (first.content_type, first.headers, first.attempts) == ("text/plain", '{"n": 0}', 0)
    assert first.created_at.tzinfo is not None


def test_claim_takes_at_most_limit_and_only_due_rows(make_store: StoreFactory) -> None:
    store = make_store("a")
    store.enqueue(msgs(5))
    first, _ = store.claim(2, NO_BYTE_LIMIT)
    store.settle(SettleBatch(changes=(RowChange(first.id, PENDING, 1, LEASE, "nacked: x"),)))
    assert len(store.claim(10, NO_BYTE_LIMIT)) == 3, "the retried row came due early"
    assert store.claim(10, NO_BYTE_LIMIT) == []


def test_a_relay_claims_no_row_it_holds(make_store: StoreFactory) -> None:
    store = make_store("a")
    assert store.claim(2, NO_BYTE_LIMIT) == []
    store.enqueue(msgs(5))
    claims = [[r.id for r in store.claim(n, NO_BYTE_LIMIT)] for n in (2, 2, 10, 10)]
    assert [len(c) for c in claims] == [2, 2, 1, 0]
    assert len({i for c in claims for i in c}) == 5


def test_a_claim_reading_on_leaves_out_rows_held_beyond_its_place(
    make_store: StoreFactory,
) -> None:
    """Rows held from before a claim from the start, and later than it in the due order,
    are left out by the claims that read on after it too."""
    store = make_store("a")
    store.enqueue(to("x"))
    advance(store, 1)
    store.enqueue(to("yy"))
    later = {r.id for r in store.claim(10, NO_BYTE_LIMIT, skip=frozenset({"x"}))}
    assert len(later) == 2
    (early,) = store.claim(1, NO_BYTE_LIMIT)  # full: the next claim reads on after it
    assert early.exchange == "x"
    new = store.enqueue(to("z"))
    assert [r.message_id for r in store.claim(10, NO_BYTE_LIMIT)] == new
    assert store.claim(10, NO_BYTE_LIMIT) == []


@SQL_STORES
def test_a_claim_reading_on_as_a_settle_commits_never_holds_a_row_twice(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A settle forgets its rows once committed. A claim reading on in between finds a row
    the settle made due again, beyond its position: it leaves the row (still held), which a
    later claim takes once, and no row is claimed twice."""
    store = make_store("a")
    assert isinstance(store, SqlStore)
    store.enqueue(msgs(3))
    first, _second = store.claim(2, NO_BYTE_LIMIT)  # full: the next claim reads on after it
    raced: list[int] = []
    forget = store.held.settled

    def a_claim_before_forgetting(ids: Any) -> None:
        raced.extend(r.id for r in store.claim(10, NO_BYTE_LIMIT))
        forget(ids)

    monkeypatch.setattr(store.held, "settled", a_claim_before_forgetting)
    store.settle(SettleBatch(changes=(RowChange(first.id, PENDING, 0, 0.0, "lost: x"),)))
    monkeypatch.undo()
    assert first.id not in raced, "a row claimed while still held"
    assert len(raced) == 1, "the claim reading on did not run as the settle committed"
    later = [r.id for r in store.claim(10, NO_BYTE_LIMIT)]
    assert later == [first.id]
    assert store.claim(10, NO_BYTE_LIMIT) == [], "a row claimed twice while held"


def test_claims_take_no_row_of_a_bucket_whose_lease_has_less_than_the_margin_left(
    make_store: StoreFactory,
) -> None:
    store = make_store("a", margin=20.0)
    store.enqueue(msgs(2))
    advance(store, LEASE - 20.0 - SLACK)
    assert len(store.claim(1, NO_BYTE_LIMIT)) == 1
    advance(store, 2 * SLACK)
    assert store.claim(10, NO_BYTE_LIMIT) == [], "claimed with less than the margin left"
    assert store.turn() == LEASE
    assert len(store.claim(10, NO_BYTE_LIMIT)) == 1


def test_a_dead_relays_buckets_are_taken_over_when_their_lease_ends(
    make_store: StoreFactory,
) -> None:
    a, b = make_store("a"), make_store("b")
    a.enqueue(msgs(2))
    assert len(a.claim(10, NO_BYTE_LIMIT)) == 2
    assert b.claim(10, NO_BYTE_LIMIT) == [], "b owns nothing while a owns every bucket"
    advance(a, LEASE - SLACK)
    b.turn()
    assert b.claim(10, NO_BYTE_LIMIT) == []
    advance(a, SLACK)
    b.turn()
    assert len(b.claim(10, NO_BYTE_LIMIT)) == 2, "a dead relay's rows return"


@ROW_LOCKS
def test_a_turn_never_waits_on_another_relays_turn_left_open(make_store: StoreFactory) -> None:
    """Relay a froze inside its turn, its presence and its buckets locked (they had run out
    meanwhile): b's turn neither waits for a's locks nor forgets a or takes its buckets
    under them; it takes the free ones."""
    a, b = make_store("a"), make_store("b")
    assert isinstance(a, SqlStore)
    with a.writer.engine.begin() as conn:  # a's presence and its buckets' leases ran out
        past = database_time(-3 * LEASE)
        gone = sa.update(outbox_relays).where(outbox_relays.c.owner == "a")
        conn.execute(gone.values(alive_until=past))
        conn.execute(sa.update(outbox_buckets).values(lease_until=past))
    with a.engine.begin() as frozen:
        refresh(frozen, "a", LEASE, [], True)  # locks a's row and every bucket
        b.turn()  # waits for no lock (it would fail at the lock timeout)
        assert b.claim(10, NO_BYTE_LIMIT) == []
    with a.engine.connect() as conn:
        relays = set(conn.scalars(sa.select(outbox_relays.c.owner)))
        owners = set(conn.scalars(sa.select(outbox_buckets.c.owner)))
    assert relays == {"a", "b"}, "b forgot a under a's lock"
    assert owners <= {"a", None}, "b took a bucket under a's lock"


def test_buckets_are_shared_out_and_handed_over_only_when_idle(make_store: StoreFactory) -> None:
    a = make_store("a")
    a.enqueue(msgs(3))
    held = a.claim(10, NO_BYTE_LIMIT)  # every row of bucket 0
    b = make_store("b")  # a owns every bucket: b takes none yet
    a.turn()  # two relays: a keeps its lower half, and bucket 0, which holds its rows
    b.turn()
    assert b.claim(10, NO_BYTE_LIMIT) == []
    a.enqueue(msgs(1))
    a.settle(SettleBatch(sent=tuple(r.id for r in held)))
    (fourth,) = a.claim(10, NO_BYTE_LIMIT)
    a.settle(SettleBatch(sent=(fourth.id,)))
    a.turn()  # bucket 0 is idle, but in a's half: a keeps it
    b.turn()
    a.close()  # a stops: its buckets are free at once, and b takes them at its next turn
    b.enqueue(msgs(1))
    assert b.claim(10, NO_BYTE_LIMIT) == []
    b.turn()
    assert len(b.claim(10, NO_BYTE_LIMIT)) == 1


def test_relays_of_two_protocols_never_own_buckets_at_once(make_store: StoreFactory) -> None:
    """An older relay owns the outbox (this release, beside a newer one whose migrations left
    this release's protocol admitted): the newer one takes nothing while it holds buckets, and
    the older one gives its buckets up once it sees the newer one (as soon as none of its rows
    is held), which takes them at its next turn."""
    old = make_store("old")
    old.enqueue(msgs(2))
    held = old.claim(10, NO_BYTE_LIMIT)
    new = make_store("new", protocol=PROTOCOL + 1)
    assert new.fenced is Fence.WAIT_FOR_OLDER
    assert new.claim(10, NO_BYTE_LIMIT) == []
    old.turn()  # it sees the newer relay: it claims nothing more, keeps the held rows' bucket
    assert old.fenced is Fence.YIELD_TO_NEWER
    old.enqueue(msgs(1))
    assert old.claim(10, NO_BYTE_LIMIT) == []
    new.turn()
    assert new.fenced is Fence.WAIT_FOR_OLDER, "the older relay still holds a row's bucket"
    old.settle(SettleBatch(sent=tuple(r.id for r in held)))
    old.turn()  # nothing held: every bucket given up
    new.turn()
    assert new.fenced is None
    assert len(new.claim(10, NO_BYTE_LIMIT)) == 1, "the row written meanwhile"
    old.turn()
    assert old.fenced is Fence.YIELD_TO_NEWER and old.claim(10, NO_BYTE_LIMIT) == []


def test_the_first_relay_of_this_protocol_to_take_over_retires_the_older_ones_for_good(
    make_store: StoreFactory,
) -> None:
    """A relay of the release before (protocol 2) yields to one of this release, which takes
    the outbox over; then this release's relay goes away (a crash loop, a redeploy) while
    the older one still runs. The older one must not take the outbox back: it would publish
    again ids this release acked, which only the new sent log holds (an outside review: 100
    of 100 re-written ids published again). It is retired at its next turn instead, naming
    the release to run."""
    old = make_store("old", protocol=PROTOCOL - 1)
    new = make_store("new")
    assert new.fenced is Fence.WAIT_FOR_OLDER
    old.turn()
    assert old.fenced is Fence.YIELD_TO_NEWER
    new.turn()
    assert new.fenced is None and owned(new, "new") == OUTBOX_BUCKETS
    new.close()
    with pytest.raises(RetiredError, match=f"protocol {PROTOCOL} or later"):
        old.turn()
    assert owned(old, "old") == 0 and old.claim(10, NO_BYTE_LIMIT) == []


def test_a_relay_of_a_release_before_protocols_is_waited_for(make_store: StoreFactory) -> None:
    """Its presence says no protocol (it predates them): it never yields, and the newer relay
    waits until it has stopped and its leases have run out."""
    old = make_store("old", protocol=None)
    old.enqueue(msgs(1))
    new = make_store("new")
    assert new.fenced is Fence.WAIT_FOR_OLDER and new.claim(10, NO_BYTE_LIMIT) == []
    advance(old, LEASE + SLACK)  # it stopped without a word: its leases ran out
    new.turn()
    assert new.fenced is None
    assert len(new.claim(10, NO_BYTE_LIMIT)) == 1


def test_a_relay_of_a_release_before_protocols_that_comes_back_is_handed_no_share(
    make_store: StoreFactory,
) -> None:
    """A relay of a release before protocols whose broker came back while a newer relay
    owned the whole outbox is present again, counted, and holds nothing yet: the newer relay
    saw no holder, kept going, and handed it its fair share (32 buckets each, two protocols
    at once, until the newer's next turn). It gives every bucket up at once instead, and
    waits; the older takes the outbox."""
    new = make_store("new")
    assert owned(new, "new") == OUTBOX_BUCKETS
    old = make_store("old", protocol=None)
    assert owned(old, "old") == 0
    new.turn()
    assert new.fenced is Fence.WAIT_FOR_OLDER
    assert owned(new, "new") == 0
    old.turn()
    assert owned(old, "old") == OUTBOX_BUCKETS and owned(old, "new") == 0
    new.turn()
    assert new.fenced is Fence.WAIT_FOR_OLDER and owned(new, "new") == 0


def test_an_older_relay_that_left_the_relays_but_holds_a_bucket_is_waited_for(
    make_store: StoreFactory,
) -> None:
    """A relay of a release before protocols whose broker went away deletes its presence and
    keeps the buckets of the rows it holds: the fence counts bucket holders, as ``relay
    migrate`` does, so the newer relay takes nothing until that relay has given them up
    (it saw only the relays present, and took the other buckets: two protocols at once)."""
    old = make_store("old", protocol=None)
    old.enqueue(msgs(2))
    held = old.claim(10, NO_BYTE_LIMIT)
    old.turn(active=False)  # its broker blipped: it keeps only the held rows' bucket
    new = make_store("new")
    assert new.fenced is Fence.WAIT_FOR_OLDER
    assert owned(new, "new") == 0
    old.settle(SettleBatch(sent=tuple(r.id for r in held)))
    old.turn(active=False)  # nothing held: every bucket given up
    new.turn()
    assert new.fenced is None and owned(new, "new") > 0


def test_a_relay_that_cannot_publish_and_holds_a_bucket_fences_none_of_its_protocol(
    make_store: StoreFactory,
) -> None:
    """A relay of this release whose broker went away keeps the buckets of the rows it holds,
    and says its protocol while it does (present, not counted): the others of its protocol
    are not fenced by it, and share out the rest of the outbox."""
    a = make_store("a")
    a.enqueue(msgs(1))
    held = a.claim(10, NO_BYTE_LIMIT)
    a.turn(active=False)
    b = make_store("b")
    assert b.fenced is None
    assert owned(b, "a") == 1 and owned(b, "b") == OUTBOX_BUCKETS - 1
    a.settle(SettleBatch(sent=tuple(r.id for r in held)))
    a.turn(active=False)
    b.turn()
    assert owned(b, "a") == 0 and owned(b, "b") == OUTBOX_BUCKETS


def test_a_relay_the_schema_no_longer_admits_gives_its_buckets_up_and_stops(
    make_store: StoreFactory,
) -> None:
    """A migration raised the least protocol: the relay's next turn gives up every bucket it
    holds no row of and says which release to run; it claims nothing more. A relay of the
    newer protocol takes the outbox once the retired one's held rows are settled."""
    old = make_store("old")
    old.enqueue(msgs(2))
    held = old.claim(1, NO_BYTE_LIMIT)
    admit(old, PROTOCOL + 1, "outbox-relay 9.0")
    with pytest.raises(RetiredError) as raised:
        old.turn()
    assert str(raised.value) == (
        f"the outbox schema admits relays of protocol {PROTOCOL + 1} or later (outbox-relay 9.0 "
        f"or later); this relay speaks protocol {PROTOCOL}: run outbox-relay 9.0 or later"
    )
    assert old.fenced is Fence.RETIRED
    assert old.claim(10, NO_BYTE_LIMIT) == []
    new = make_store("new", protocol=PROTOCOL + 1)
    assert new.fenced is Fence.WAIT_FOR_OLDER, "the retired relay still holds a row's bucket"
    old.settle(SettleBatch(sent=tuple(r.id for r in held)))
    old.close()
    new.turn()
    assert new.fenced is None
    assert len(new.claim(10, NO_BYTE_LIMIT)) == 1, "the row the retired relay left"


def test_acked_rows_become_sent_and_are_never_claimed_again(make_store: StoreFactory) -> None:
    store = make_store("a")
    store.enqueue(msgs(2))
    rows = store.claim(10, NO_BYTE_LIMIT)
    store.settle(SettleBatch(sent=(rows[0].id,)))
    assert state(store, rows[0].id)[0] == SENT
    advance(store, 3600)
    other = make_store("b")  # the first relay died: its held row is due again, not the acked
    assert [r.id for r in other.claim(10, NO_BYTE_LIMIT)] == [rows[1].id]


def test_a_settle_held_across_a_failover_that_lost_its_rows_leaves_the_rows_given_their_ids(
    make_store: StoreFactory,
) -> None:
    """A failover to an asynchronous standby (or a restore to a point in time) lost rows the
    relay had claimed, and the sequence's advance with them: new rows took their ids. The
    relay's settle of the lost rows, retried across the failover, leaves the new rows as
    they were (an ack deleted one as sent, never published; a drop deleted one; a failure
    parked one), and they are claimed."""
    store = make_store("a")
    if isinstance(store, InMemoryStore) or not of(store.engine).reuses_ids:
        pytest.skip("a database that hands no id out again")
    store.enqueue(msgs(3))
    lost = [r.id for r in store.claim(10, NO_BYTE_LIMIT)]
    with store.writer.engine.begin() as conn:
        conn.execute(sa.delete(outbox).where(outbox.c.id.in_(lost)))
        conn.execute(
            sa.insert(outbox),
            [{"id": i, "message_id": f"new-{i}", "exchange": "ex", "payload": b"x"} for i in lost],
        )
    change = RowChange(lost[2], PARKED, 1, 0.0, "nacked: x")
    store.settle(SettleBatch(sent=(lost[0],), duplicates=(lost[1],), changes=(change,)))
    assert [state(store, i) for i in lost] == [(PENDING, 0, None)] * 3
    advance(store, 3600)
    claimed = make_store("b").claim(10, NO_BYTE_LIMIT)
    assert sorted(r.message_id for r in claimed) == [f"new-{i}" for i in lost]


def test_changes_apply_only_while_the_bucket_is_ours(make_store: StoreFactory) -> None:
    a, b = make_store("a"), make_store("b")
    a.enqueue(msgs(2))
    failed, acked = a.claim(10, NO_BYTE_LIMIT)
    advance(a, LEASE)
    b.turn()
    assert [r.id for r in b.claim(10, NO_BYTE_LIMIT)] == [failed.id, acked.id]
    a.settle(SettleBatch(changes=(RowChange(failed.id, PARKED, 1, 0.0, "nacked: x"),)))
    assert state(a, failed.id) == (PENDING, 0, None), "a stale failure overwrote b's lease"
    a.settle(SettleBatch(sent=(acked.id,)))
    assert state(a, acked.id)[0] == SENT, "an ack proves delivery whoever holds the row"


def test_changes_apply_after_a_lease_ran_out_while_no_one_took_the_bucket(
    make_store: StoreFactory,
) -> None:
    a = make_store("a")
    a.enqueue(msgs(1))
    (row,) = a.claim(10, NO_BYTE_LIMIT)
    advance(a, LEASE + SLACK)  # a turn came late; no other relay is there to take over
    a.settle(SettleBatch(changes=(RowChange(row.id, PENDING, 1, 600.0, "nacked: x"),)))
    assert state(a, row.id) == (PENDING, 1, "nacked: x"), "the attempt was not charged"


def test_retry_and_park(make_store: StoreFactory) -> None:
    store = make_store("a")
    store.enqueue(msgs(2))
    r1, r2 = store.claim(10, NO_BYTE_LIMIT)
    delay = 30.0
    store.settle(
        SettleBatch(
            changes=(
                RowChange(r1.id, PENDING, 1, delay, "nacked: x"),
                RowChange(r2.id, PARKED, 3, 0.0, "returned: 312 NO_ROUTE"),
            )
        )
    )
    assert state(store, r1.id) == (PENDING, 1, "nacked: x")
    assert state(store, r2.id) == (PARKED, 3, "returned: 312 NO_ROUTE")
    advance(store, delay - SLACK)
    assert store.claim(10, NO_BYTE_LIMIT) == [], "retried before its back-off"
    advance(store, SLACK)
    (again,) = store.claim(10, NO_BYTE_LIMIT)
    assert (again.id, again.attempts, again.republish) == (r1.id, 1, True)


@pytest.mark.parametrize("make_store", ["sqlite", "postgresql", "mariadb"], indirect=True)
def test_a_row_is_settled_with_its_errors_cause(make_store: StoreFactory) -> None:
    """A parked row's cause is written beside its error (``relay.causes.stored_cause``), read
    from the whole error: the console lists, counts and selects parked rows by it. A row
    left pending has none: parked later by a relay of the release before (which writes no
    cause), it kept a retry's, not its error's (an outside review)."""
    store = make_store("a")
    store.enqueue(msgs(2))
    r1, r2 = store.claim(10, NO_BYTE_LIMIT)
    named = "failed: 404 NOT_FOUND - no exchanges " + ", ".join(f"'t-{i}'" for i in range(100))
    changes = (
        RowChange(r1.id, PARKED, 3, 0.0, named),
        RowChange(r2.id, PENDING, 1, 30.0, "nacked: 2"),
    )
    store.settle(SettleBatch(changes=changes))
    assert isinstance(store, SqlStore)
    with store.engine.connect() as conn:
        causes = dict(conn.execute(sa.select(outbox.c.id, outbox.c.cause)).all())
    each = "failed: 404 NOT_FOUND - no exchanges " + ", ".join(["'…'"] * 100)
    assert causes == {r1.id: each[:CAUSE_MAX_CHARS], r2.id: None}


@pytest.mark.parametrize("make_store", ["memory", "sqlite", "postgresql"], indirect=True)
def test_a_row_parked_with_an_exchange_no_broker_takes_never_fails_the_others_settle(
    make_store: StoreFactory,
) -> None:
    """A writer's exchange of 6,000 characters that do not compress (MySQL's column holds
    255): the relay parks the row as malformed, and the parking statement, with the rest of
    its settle, failed on PostgreSQL while the console's index held exchanges whole."""
    long = "".join(random.Random(0).choices(string.ascii_letters + string.digits, k=6000))
    store = make_store("a")
    store.enqueue([NewMessage(b"x", exchange=long), NewMessage(b"y", exchange="ok")])
    bad, good = store.claim(10, NO_BYTE_LIMIT)
    malformed = "rejected: exchange: longer than 255 bytes"
    store.settle(
        SettleBatch(sent=(good.id,), changes=(RowChange(bad.id, PARKED, 1, 0.0, malformed),))
    )
    assert state(store, bad.id) == (PARKED, 1, malformed)
    assert store.claim(10, NO_BYTE_LIMIT) == []


def test_backlog_counts_due_rows_and_the_oldest_wait(make_store: StoreFactory) -> None:
    store = make_store("a")
    store.enqueue(msgs(3))
    advance(store, 10)
    stats = store.backlog()
    assert stats.due == 3
    # SQLite's column default has whole seconds: a row may look up to 1 s older.
    assert 10.0 <= stats.oldest_due_age < 10.0 + SLACK
    (first,) = store.claim(1, NO_BYTE_LIMIT)
    assert store.backlog().due == 3, "rows in flight are due until settled"
    store.settle(SettleBatch(sent=(first.id,)))
    assert store.backlog().due == 2
    store.settle(SettleBatch(sent=tuple(r.id for r in store.claim(10, NO_BYTE_LIMIT))))
    assert (store.backlog().due, store.backlog().oldest_due_age) == (0, 0.0)


def test_a_big_backlog_is_counted_up_to_a_bound_and_estimated_beyond(
    make_store: StoreFactory,
) -> None:
    store = make_store("a")
    store.enqueue([NewMessage(b"x") for _ in range(BACKLOG_EXACT_ROWS + 50)])
    advance(store, 10)
    stats = store.backlog()
    assert stats.due > BACKLOG_EXACT_ROWS
    assert 10.0 <= stats.oldest_due_age < 10.0 + SLACK


def keyed(*keys: str | None) -> list[NewMessage]:
    return [NewMessage(f"{k}-{i}".encode(), "ex", ordering_key=k) for i, k in enumerate(keys)]


@SQL_STORES
def test_a_row_due_again_as_full_claims_read_on_is_taken_by_the_next_claim(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sustained backlog: every claim comes back full. A claim reading on as a settle
    commits finds a row the settle made due again, still held, and leaves it; the claim after
    it takes the row, rather than reading on past it until the backlog ends (a claim came
    back short): the row starved behind new rows."""
    store = make_store("a")
    assert isinstance(store, SqlStore)
    # Not this rule's: a claim from the start at least every READ_ON_MAX_S.
    monkeypatch.setattr("relay.db.claims.READ_ON_MAX_S", 3600.0)
    store.enqueue(msgs(3))
    first, _second = store.claim(2, NO_BYTE_LIMIT)  # full: the next claim reads on after it
    raced: list[int] = []
    forget = store.held.settled

    def a_full_claim_before_forgetting(ids: Any) -> None:
        # Written after the settle: due after the row it made due again (SQLite's default
        # times are whole seconds: they must be in a later one).
        if store.engine.dialect.name == "sqlite":
            time.sleep(1.0)
        store.enqueue([NewMessage(f"new {i}".encode(), "ex") for i in range(5)])
        # Full: the third row, and the first, due again and still held.
        raced.extend(r.id for r in store.claim(2, NO_BYTE_LIMIT))
        forget(ids)

    monkeypatch.setattr(store.held, "settled", a_full_claim_before_forgetting)
    store.settle(SettleBatch(changes=(RowChange(first.id, PENDING, 0, 0.0, "lost: x"),)))
    monkeypatch.setattr(store.held, "settled", forget)
    assert len(raced) == 1 and first.id not in raced
    assert first.id in [r.id for r in store.claim(2, NO_BYTE_LIMIT)], "passed by, held back"


def test_with_ordering_a_keys_next_row_is_taken_once_its_last_is_settled(
    make_store: StoreFactory,
) -> None:
    """A key's second row is left out while its first is pending, and a full claim takes
    rows after it; once the first is settled, the next claim takes the second (claims with
    ordering never read on past the rows they left out)."""
    a = make_store("a", ordered=True)
    a.enqueue(keyed("k", "k", None, None, None, None))
    first = a.claim(3, NO_BYTE_LIMIT)
    assert [r.payload for r in first] == [b"k-0", b"None-2", b"None-3"]
    a.settle(SettleBatch(sent=(first[0].id,)))
    assert [r.payload for r in a.claim(3, NO_BYTE_LIMIT)] == [b"k-1", b"None-4", b"None-5"]


def test_ordered_claims_take_each_keys_earliest_pending_row_only(
    make_store: StoreFactory,
) -> None:
    a = make_store("a", ordered=True)
    a.enqueue(keyed("k1", "k2", "k1", None, "k2", None, "k1"))
    first = a.claim(10, NO_BYTE_LIMIT)
    assert [r.payload for r in first] == [b"k1-0", b"k2-1", b"None-3", b"None-5"]
    # The later rows of k1 and k2 are blocked by the claimed (pending) ones.
    assert a.claim(10, NO_BYTE_LIMIT) == []
    k1, k2 = first[0], first[1]
    delay = 30.0
    retried = RowChange(k2.id, PENDING, 1, delay, "nacked")
    a.settle(SettleBatch(sent=(k1.id,), changes=(retried,)))
    # k1's next row is free; k2's waits behind its retried row, even after that row's due.
    assert [r.payload for r in a.claim(10, NO_BYTE_LIMIT)] == [b"k1-2"]
    advance(a, delay)
    assert [r.payload for r in a.claim(10, NO_BYTE_LIMIT)] == [b"k2-1"]


class Ticking:
    """``time`` as the claim store reads it, standing still until moved."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now


@SQL_STORES
def test_ordered_claims_look_at_the_front_of_a_backlog_and_at_all_of_it_every_second(
    make_store: StoreFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key's first row behind more rows than a claim looks at (rows of a key with an
    earlier row held) is taken by the claim that looks at every due row, made once
    ORDERED_LOOK_ALL_S have passed since the last; the claims between look at the front
    only, however deep the backlog (each read all of it: a second a claim on a busy MariaDB
    behind 20,000 rows, and the relays fell behind their writers for good)."""
    clock = Ticking()
    monkeypatch.setattr("relay.db.claims.time", clock)
    a = make_store("a", ordered=True)
    looked_at = 2 * ORDERED_LOOK_PER_ROW  # by a claim of two rows
    a.enqueue(keyed(*["k"] * (looked_at + 5)))
    assert [r.payload for r in a.claim(2, NO_BYTE_LIMIT)] == [b"k-0"]  # looks at all
    a.enqueue(keyed("j"))  # its key's first row, behind every k row
    assert a.claim(2, NO_BYTE_LIMIT) == [], "looked at the whole backlog"
    clock.now += ORDERED_LOOK_ALL_S
    assert [r.payload for r in a.claim(2, NO_BYTE_LIMIT)] == [b"j-0"]
    assert a.claim(2, NO_BYTE_LIMIT) == []


def test_parked_rows_do_not_block_their_key_and_unordered_stores_ignore_keys(
    make_store: StoreFactory,
) -> None:
    a = make_store("a", ordered=True)
    a.enqueue(keyed("k", "k", "k"))
    (head,) = a.claim(10, NO_BYTE_LIMIT)
    a.settle(SettleBatch(changes=(RowChange(head.id, PARKED, 1, 0.0, "rejected: x"),)))
    (second,) = a.claim(10, NO_BYTE_LIMIT)
    assert second.payload == b"k-1"
    a.settle(SettleBatch(changes=(RowChange(second.id, PENDING, 1, 0.0, "nacked: x"),)))
    a.close()
    unordered = make_store("u")
    unordered.enqueue(keyed("j", "j"))
    # k-2 waits behind k-1 for an ordered relay, not for this one.
    claimed = [r.payload for r in unordered.claim(10, NO_BYTE_LIMIT)]
    assert claimed == [b"k-1", b"k-2", b"j-0", b"j-1"]


def sized(*sizes: int) -> list[NewMessage]:
    return [NewMessage(b"x" * n, "ex", f"rk.{i}") for i, n in enumerate(sizes)]


def test_a_claim_takes_no_more_payload_bytes_than_asked(make_store: StoreFactory) -> None:
    store = make_store("a")
    store.enqueue(sized(400, 300, 200, 100))
    assert [r.size for r in store.claim(10, 750)] == [400, 300]
    assert store.claim(10, 199) == [], "a row that does not fit is left, not split"
    assert [r.size for r in store.claim(10, 300)] == [200, 100]


def test_a_row_larger_than_the_limit_is_claimed_alone_when_asked(
    make_store: StoreFactory,
) -> None:
    a = make_store("a")
    a.enqueue(sized(5000, 10, 10))
    assert a.claim(10, 1000) == []
    (big,) = a.claim(10, 1000, first_always=True)
    assert big.size == 5000
    assert [r.size for r in a.claim(10, 1000, first_always=True)] == [10, 10]


def test_a_row_larger_than_the_largest_message_is_claimed_unread(
    make_store: StoreFactory,
) -> None:
    """Its payload and headers are never fetched: it comes back with its id, message id and
    the reason (both sizes), to be parked, and counts nothing against the byte budget."""
    store = make_store("a", max_message_size=1000)
    store.enqueue(
        [*sized(500, 2000), NewMessage(b"x" * 300, "ex", headers=json.dumps({"h": "y" * 800}))]
    )
    small, big, headed = store.claim(10, 600)
    assert (small.size, small.unreadable) == (500, None)
    for row, size in ((big, 2000), (headed, 300 + len(json.dumps({"h": "y" * 800})))):
        assert (row.payload, row.headers) == (b"", None)
        assert row.message_id and row.unreadable is not None
        assert f"{size} bytes" in row.unreadable and "1000 bytes" in row.unreadable


def to(exchanges: str) -> list[NewMessage]:
    return [NewMessage(f"{e}-{i}".encode(), e) for i, e in enumerate(exchanges)]


def test_a_claim_leaves_out_the_exchanges_it_skips(make_store: StoreFactory) -> None:
    store = make_store("a")
    store.enqueue(to("abcab"))
    skipped = store.claim(10, NO_BYTE_LIMIT, skip=frozenset({"a", "c"}))
    assert [r.payload for r in skipped] == [b"b-1", b"b-4"]
    assert [r.payload for r in store.claim(10, NO_BYTE_LIMIT)] == [b"a-0", b"c-2", b"a-3"]


def test_hasten_makes_backed_off_rows_of_an_exchange_due_now(make_store: StoreFactory) -> None:
    a, b = make_store("a"), make_store("b")
    a.enqueue(to("xxyx"))
    x0, x1, y2, x3 = a.claim(10, NO_BYTE_LIMIT)
    held = "failed: the broker refuses exchange 'x'"
    backed_off = (
        RowChange(x0.id, PENDING, 1, 600.0, held),
        RowChange(y2.id, PENDING, 1, 600.0, held),
    )
    a.settle(SettleBatch(changes=(*backed_off, RowChange(x1.id, PENDING, 1, 600.0, held))))
    advance(a, LEASE + SLACK)
    b.turn()
    (taken,) = b.claim(1, NO_BYTE_LIMIT)  # x3, whose relay's lease ran out: b's now
    assert taken.id == x3.id
    a.enqueue(to("x"))  # attempts 0: no back-off to cut short, whatever its time
    assert a.hasten(["x"]) == 2, "x0 and x1 only"
    assert a.hasten([]) == 0
    due = {r.id for r in b.claim(10, NO_BYTE_LIMIT)}
    assert x0.id in due and x1.id in due and y2.id not in due and x3.id not in due
    assert state(a, x0.id) == (PENDING, 1, held), "the attempt stays charged"


def test_a_suspect_is_claimed_as_one_until_a_change_clears_it(make_store: StoreFactory) -> None:
    store = make_store("a")
    store.enqueue(msgs(2))
    r1, r2 = store.claim(10, NO_BYTE_LIMIT)
    assert (r1.suspect, r2.suspect) == (False, False)
    lost = "lost: channel closed by the broker: 406 x"
    store.settle(SettleBatch(changes=(RowChange(r1.id, PENDING, 0, 0.0, lost, True),)))
    store.settle(SettleBatch(changes=(RowChange(r2.id, PENDING, 0, 0.0, "lost: x"),)))
    claimed = {r.id: r.suspect for r in store.claim(10, NO_BYTE_LIMIT)}
    assert claimed == {r1.id: True, r2.id: False}
    store.settle(SettleBatch(changes=(RowChange(r1.id, PENDING, 1, 0.0, "nacked: x"),)))
    (again,) = (r for r in store.claim(10, NO_BYTE_LIMIT) if r.id == r1.id)
    assert again.suspect is False
