"""Acked rows leave the outbox for the sent log (``keep_sent = ids``), and the outbox still
keeps its promises through it: a message id written again within the dedupe horizon is
never published again, whoever writes it and however, and after a crash that emptied the log
(PostgreSQL's is unlogged: ``relay.db.sentlog``); status counts the sent; the purge ends the
horizon."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa

from devtools.outbox import statuses
from devtools.servers import PostgresServer, wait_until
from relay.db.claims import ClaimStore
from relay.db.clock import database_time
from relay.db.columns import sent_key_value
from relay.db.dialects import of
from relay.db.migrate import migrate
from relay.db.outbox import OutboxAdmin, OutboxWriter
from relay.db.schema import (
    SENT_LOG,
    outbox,
    outbox_sent,
    outbox_sent_journal,
    outbox_sent_state,
)
from relay.db.sentlog import SentLogRebuild, purge_chunk
from relay.db.sink import OutboxSink
from relay.errors import RelayError, StoreError
from relay.records import KEEP_IDS, KEEP_MESSAGES, PENDING, NewMessage, RowChange, SettleBatch
from relay.sentlog import SentLogWatch
from relay.sentlog_tasks import whole_sent_log
from relay.wakeup import Wakeup
from tests.support.inprocess import logged, settings
from tests.support.rows import sink_chunk

DAY = 24 * 3600.0
NO_BYTE_LIMIT = 2**62


class Outbox:
    """A relay's store, a writer, a sink and the admin on one database."""

    def __init__(self, url: str, keep_sent: str = KEEP_IDS) -> None:
        self.url = url
        self.store = ClaimStore(url, "relay-1", 60.0, keep_sent=keep_sent)
        self.store.turn()
        self.writer = OutboxWriter(url)
        self.sink = OutboxSink(url)
        self.admin = OutboxAdmin(url)

    def relay_all(self) -> list[int]:
        """Claim every due row and ack it; the ids acked."""
        rows = self.store.claim(10_000, NO_BYTE_LIMIT)
        self.store.settle(SettleBatch(sent=tuple(r.id for r in rows)))
        return [r.id for r in rows]

    def message_ids(self) -> list[str]:
        with self.writer.engine.connect() as conn:
            return list(conn.scalars(sa.select(outbox.c.message_id).order_by(outbox.c.id)))

    def close(self) -> None:
        for part in (self.store, self.writer, self.sink, self.admin):
            part.close()


@pytest.fixture
def box(database_url: str) -> Iterator[Outbox]:
    made = Outbox(database_url)
    yield made
    made.close()


def message(message_id: str) -> NewMessage:
    return NewMessage(b"body", "ex", "rk", message_id=message_id)


def test_acked_rows_leave_the_outbox_for_the_sent_log(box: Outbox) -> None:
    box.writer.enqueue([message("m-1"), message("m-2")])
    acked = box.relay_all()
    assert box.message_ids() == []
    with box.writer.engine.connect() as conn:
        logged = sorted(conn.scalars(sa.select(outbox_sent.c.id)))
    assert logged == sorted(acked)
    assert statuses(box.url) == {"sent": 2}
    report = box.admin.status()
    assert report.counts == {"pending": 0, "sent": 2, "parked": 0}
    assert report.recent.messages == 2
    assert 0 <= report.recent.latency_mean <= report.recent.latency_max < 60


def claimable(store: ClaimStore) -> list[str]:
    """The message ids a relay would publish now; the duplicates among the due rows are
    settled (dropped) as the loop does."""
    rows = store.claim(10_000, NO_BYTE_LIMIT)
    store.settle(SettleBatch(duplicates=tuple(r.id for r in rows if r.sent_before)))
    fresh = [r for r in rows if not r.sent_before]
    store.settle(SettleBatch(changes=tuple(RowChange(r.id, PENDING, 0, 0.0, "") for r in fresh)))
    return [r.message_id for r in fresh]


@pytest.mark.parametrize("how", ["enqueue", "sink append", "sink stage and merge"])
def test_a_sent_message_id_written_again_is_never_published_again(box: Outbox, how: str) -> None:
    box.writer.enqueue([message("m-1"), message("m-2")])
    box.relay_all()
    again = ["m-1", "m-3", "m-2"]
    if how == "enqueue":
        box.writer.enqueue([message(m) for m in again])
    elif how == "sink append":
        assert box.sink.append([sink_chunk(again)]) == (3, 3)
    else:
        stage = box.sink.create_stage()
        box.sink.stage(stage, [sink_chunk(again)], partition=0)
        assert box.sink.merge(stage, keep_order=True) == 3
    assert claimable(box.store) == ["m-3"]
    assert box.message_ids() == ["m-3"]
    assert box.admin.status().duplicates == 2


def test_a_write_racing_the_ack_of_the_same_message_id_is_dropped(postgresql_url: str) -> None:
    """The relay deletes the row and logs its key in one transaction; a writer inserting the
    same id meanwhile waits on the unique index, and its row, committed after the ack, is
    claimed as sent before."""
    box = Outbox(postgresql_url)
    try:
        box.writer.enqueue([message("m-1")])
        (row,) = box.store.claim(10, NO_BYTE_LIMIT)
        with box.store.engine.connect() as relay:
            ack = {"ids": [row.id], "message_ids": [row.message_id]}
            relay.execute(box.store._settles._acked[0], ack)
            written = threading.Thread(target=box.writer.enqueue, args=([message("m-1")],))
            written.start()
            written.join(1.0)
            assert written.is_alive(), "the writer did not wait for the relay's transaction"
            relay.commit()
        written.join(10.0)
        assert not written.is_alive()
        box.store.settle(SettleBatch(sent=(row.id,)))  # the relay's own bookkeeping
        assert box.message_ids() == ["m-1"]
        assert claimable(box.store) == []
        assert box.message_ids() == []
    finally:
        box.close()


def sent_days_ago(conn: sa.Connection, row_id: int, days: float) -> None:
    """The entry of the acked row ``row_id`` as if sent ``days`` ago: in the log, and where
    the log is journaled, in the journal's row of its ack (which the purge reads there)."""
    when = database_time(-days * DAY)
    conn.execute(sa.update(outbox_sent).where(outbox_sent.c.id == row_id).values(sent_at=when))
    if of(conn).journals_sent_log:
        journal = outbox_sent_journal
        acked = sa.literal(row_id, sa.BigInteger()) == sa.any_(journal.c.ids)
        conn.execute(sa.update(journal).where(acked).values(sent_at=when))


def sent_old_and_new(box: Outbox) -> None:
    """Two messages acked: "old" as if 8 days ago, past a 7-day horizon, and "new" now."""
    acked = {}
    for name in ("old", "new"):
        box.writer.enqueue([message(name)])
        (acked[name],) = box.relay_all()
    with box.writer.engine.begin() as conn:
        sent_days_ago(conn, acked["old"], 8)


def test_the_purge_ends_the_dedupe_horizon(box: Outbox) -> None:
    sent_old_and_new(box)
    assert box.admin.purge(7 * DAY, chunk=1) == 1
    assert statuses(box.url) == {"sent": 1}
    box.writer.enqueue([message("old"), message("new")])
    assert claimable(box.store) == ["old"], "past the horizon an id is new again; within, not"


def test_sent_rows_kept_whole_stay_and_count_once(database_url: str) -> None:
    box = Outbox(database_url, keep_sent=KEEP_MESSAGES)
    try:
        box.writer.enqueue([message("m-1")])
        box.relay_all()
        assert box.message_ids() == ["m-1"]
        assert statuses(box.url) == {"sent": 1}
        assert box.admin.status().counts["sent"] == 1
        assert box.admin.purge(0.0) == 1
        assert box.message_ids() == []
    finally:
        box.close()


def lose_the_log(url: str) -> None:
    """What a crash (or a failover to a standby) leaves of the sent log: on a database that
    journals it, an empty log and no state row (unlogged, both); elsewhere the log is never
    emptied, and only a state row deleted by hand can be missing."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            if of(conn).journals_sent_log:
                conn.execute(sa.delete(outbox_sent))
            conn.execute(sa.delete(outbox_sent_state))
    finally:
        engine.dispose()


def rebuild(url: str) -> int:
    """A relay's rebuild of the sent log: the entries it copied."""
    rebuilder = SentLogRebuild(url)
    try:
        copied = rebuilder.rebuild()
        assert copied is not None
        assert rebuilder.complete()
        return copied
    finally:
        rebuilder.close()


def waits_on_a_lock(engine: sa.Engine, query_like: str = "%") -> Callable[[], bool]:
    """Whether one statement of this database (``query_like``: its text, as LIKE matches it)
    waits on a lock: looked at in a snapshot of its own."""
    waiting = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database() AND query LIKE :query"
    )

    def blocked() -> bool:
        with engine.connect() as other:
            return bool(other.execute(waiting, {"query": query_like}).scalar_one() == 1)

    return blocked


def test_no_row_is_claimed_until_a_lost_sent_log_is_rebuilt(box: Outbox) -> None:
    """The log lost (as a crash loses PostgreSQL's): due rows stay unclaimed, whatever they
    are, until a relay has rebuilt it from its journal; then a re-written id is dropped and a
    new one published, as before the loss."""
    box.writer.enqueue([message("m-1"), message("m-2")])
    box.relay_all()
    lose_the_log(box.url)
    box.writer.enqueue([message("m-1"), message("m-3")])
    assert box.store.claim(10_000, NO_BYTE_LIMIT) == []
    rebuild(box.url)
    assert claimable(box.store) == ["m-3"]
    assert box.admin.status().duplicates == 1


def test_one_relay_rebuilds_while_another_waits_and_every_entry_is_copied_once(
    postgresql_url: str,
) -> None:
    """Twenty acks of two entries and one of ten: while one relay holds the rebuild (the
    state row's lock), another's try comes back at once, rebuilding nothing; the rebuild
    copies every acked id once, and every one is known again, no other."""
    box = Outbox(postgresql_url)
    try:
        acked = []
        for n in range(21):
            ids = [f"m-{n}-{k}" for k in range(10 if n == 7 else 2)]
            box.writer.enqueue([message(m) for m in ids])
            box.relay_all()
            acked += ids
        lose_the_log(postgresql_url)
        first, second = SentLogRebuild(postgresql_url), SentLogRebuild(postgresql_url)
        try:
            assert not first.complete()
            with first.engine.begin() as conn:
                conn.execute(sa.insert(outbox_sent_state).values(log=SENT_LOG, complete=False))
            with first.engine.begin() as conn:  # as the first's rebuild holds it
                conn.execute(sa.select(outbox_sent_state).with_for_update())
                assert second.rebuild() is None
            assert first.rebuild() == len(acked) == 50
            assert second.rebuild() == 0, "complete: nothing left to copy"
        finally:
            first.close()
            second.close()
        box.writer.enqueue([*(message(m) for m in acked), message("new")])
        assert claimable(box.store) == ["new"]
    finally:
        box.close()


def test_a_key_journaled_twice_is_rebuilt_with_its_latest_entry(postgresql_url: str) -> None:
    """A message id sent again once the purge took its log entry, but not yet its journal
    row: the rebuild keeps the later entry, which the purge of the earlier row leaves, so
    that the id stays known for its whole horizon."""
    box = Outbox(postgresql_url)
    try:
        box.writer.enqueue([message("twice")])
        box.relay_all()
        key = sent_key_value("twice", box.writer.engine.dialect)
        with box.writer.engine.begin() as conn:
            conn.execute(sa.delete(outbox_sent))  # the purge took the entry, not the row
            conn.execute(sa.update(outbox_sent_journal).values(sent_at=database_time(-8 * DAY)))
        box.writer.enqueue([message("twice")])
        box.relay_all()
        lose_the_log(postgresql_url)
        assert rebuild(postgresql_url) == 1
        assert box.admin.purge(7 * DAY) == 1, "the earlier row's entry"
        box.writer.enqueue([message("twice")])
        assert claimable(box.store) == [], "the later entry is kept"
        with box.writer.engine.connect() as conn:
            assert conn.execute(sa.select(outbox_sent.c.key)).scalars().all() == [key]
    finally:
        box.close()


def test_a_rebuild_cancelled_as_its_relay_stops_rolls_back(postgresql_url: str) -> None:
    """The relay stops while its rebuild waits (here behind an operator's lock): the
    statement is cancelled, nothing is copied, and the log stays incomplete for the next
    relay to rebuild."""
    box = Outbox(postgresql_url)
    box.writer.enqueue([message("m-1")])
    box.relay_all()
    lose_the_log(postgresql_url)
    rebuilder = SentLogRebuild(postgresql_url)
    failed: list[BaseException] = []

    def run() -> None:
        try:
            rebuilder.rebuild()
        except RelayError as exc:
            failed.append(exc)

    try:
        with box.writer.engine.begin() as conn:
            conn.execute(sa.text("LOCK TABLE outbox_sent_log IN SHARE MODE"))
            thread = threading.Thread(target=run)
            thread.start()
            copying = "WITH copied AS%INSERT INTO outbox_sent_log %"
            blocked = waits_on_a_lock(box.admin.engine, copying)
            wait_until(blocked, 30, "the rebuild waiting on the lock")
            rebuilder.cancel()
            thread.join(timeout=30)
        assert not thread.is_alive()
        assert len(failed) == 1 and "canceling statement due to user request" in str(failed[0])
        assert not rebuilder.complete()
        assert rebuild(postgresql_url) == 1
    finally:
        rebuilder.close()
        box.close()


def test_a_relay_killed_mid_rebuild_leaves_it_to_the_next_at_once(postgresql_url: str) -> None:
    """A relay killed (SIGKILL) while its rebuild's statement runs (here waiting behind an
    operator's lock, which it waits for as long as it is held, as it copies for as long as
    the journal needs): the server ends the statement as it finds the relay gone, rolling
    back and freeing the state row, rather than going on to the end; the next relay
    rebuilds."""
    box = Outbox(postgresql_url)
    box.writer.enqueue([message("m-1")])
    box.relay_all()
    lose_the_log(postgresql_url)
    script = (
        "import sys; from relay.db.sentlog import SentLogRebuild; "
        "SentLogRebuild(sys.argv[1]).rebuild()"
    )
    copying = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE query LIKE 'WITH copied AS%INSERT INTO%'"
    )

    def running() -> int:
        with box.admin.engine.connect() as other:  # a snapshot of its own
            return int(other.execute(copying).scalar_one())

    try:
        with box.writer.engine.begin() as conn:
            conn.execute(sa.text("LOCK TABLE outbox_sent_log IN SHARE MODE"))
            relay = subprocess.Popen([sys.executable, "-c", script, postgresql_url])
            try:
                wait_until(lambda: running() == 1, 60, "the rebuild waiting on the lock")
            finally:
                relay.kill()
                relay.wait(timeout=30)
            wait_until(lambda: running() == 0, 30, "the killed relay's statement ended")
        assert rebuild(postgresql_url) == 1
    finally:
        box.close()


def test_the_purge_ends_the_horizon_after_a_rebuild_too(postgresql_url: str) -> None:
    """The journal's rows of purged entries go with them: a rebuild after the purge brings
    back no id past the horizon."""
    box = Outbox(postgresql_url)
    try:
        sent_old_and_new(box)
        assert box.admin.purge(7 * DAY) == 1
        lose_the_log(postgresql_url)
        assert rebuild(postgresql_url) == 1
        box.writer.enqueue([message("old"), message("new")])
        assert claimable(box.store) == ["old"]
    finally:
        box.close()


def test_no_journal_row_is_purged_while_the_log_is_not_complete(postgresql_url: str) -> None:
    """A rebuild copies the journal as it was when its statement began: a row purged
    meanwhile would come back as a log entry no journal row holds, which no purge would ever
    find. So the purge leaves the journal while the log is incomplete, and ends the horizon
    once the log is whole again."""
    box = Outbox(postgresql_url)
    try:
        sent_old_and_new(box)
        lose_the_log(postgresql_url)
        assert box.admin.purge(7 * DAY) == 0
        with box.writer.engine.connect() as conn:
            assert (
                conn.execute(sa.select(sa.func.count()).select_from(outbox_sent_journal)).scalar()
                == 2
            )
        assert rebuild(postgresql_url) == 2
        assert box.admin.purge(7 * DAY) == 1
        with box.writer.engine.connect() as conn:
            left = conn.execute(sa.select(outbox_sent.c.key)).scalars().all()
        assert left == [sent_key_value("new", box.writer.engine.dialect)]
    finally:
        box.close()


def test_a_state_row_deleted_during_a_purge_chunk_waits_for_it(postgresql_url: str) -> None:
    """An operator deletes the state row (to have the log rebuilt) while a purge chunk is
    under way, and a relay's rebuild follows. Either would read the journal before the
    chunk commits and copy back the entry the chunk deletes: a log entry no journal row
    holds, never purged, its id a duplicate for ever. The chunk holds the state row until it
    commits, so the delete waits for it, and the rebuild copies only what the journal keeps."""
    box = Outbox(postgresql_url)
    try:
        sent_old_and_new(box)
        one_chunk = purge_chunk(database_time(-7 * DAY), 5000)
        rebuilt: list[int] = []

        def by_hand_then_rebuild() -> None:
            with box.admin.engine.begin() as conn:
                conn.execute(sa.delete(outbox_sent_state))
            rebuilt.append(rebuild(postgresql_url))

        blocked = waits_on_a_lock(box.admin.engine)
        with box.writer.engine.connect() as purging:
            with purging.begin():
                assert one_chunk(purging) == 1
                thread = threading.Thread(target=by_hand_then_rebuild)
                thread.start()
                wait_until(blocked, 30, "the delete, or the rebuild, waiting for the chunk")
            thread.join(timeout=30)
        assert rebuilt == [0], "the log kept the new entry, and the purged one stays purged"
        with box.writer.engine.connect() as conn:
            left = conn.execute(sa.select(outbox_sent.c.key)).scalars().all()
        assert left == [sent_key_value("new", box.writer.engine.dialect)]
        box.writer.enqueue([message("old"), message("new")])
        assert claimable(box.store) == ["old"], "past its horizon and purged: new again"
    finally:
        box.close()


def test_a_relay_says_the_log_is_incomplete_while_it_rebuilds_it(
    postgresql_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A relay's looks at the log (``relay.daemon``): from the look that finds it lost, the
    relay says it incomplete while it rebuilds it (held here behind a lock on the journal),
    complete once rebuilt; a second loss right after the rebuild is warned of again, as the
    first."""
    caplog.set_level(logging.INFO)
    values = settings(postgresql_url, "amqp://guest:guest@127.0.0.1:1/%2F")
    watch = SentLogWatch(values.lease, time.monotonic())
    box = Outbox(postgresql_url)
    box.writer.enqueue([message("m-1")])
    box.relay_all()

    def gauge() -> int:
        return 1 if watch.complete else 0

    blocked = waits_on_a_lock(box.admin.engine, "WITH copied AS%")

    def rebuilt(times: int) -> bool:
        return len(logged(caplog, "sent_log_rebuilt")) == times

    async def scenario() -> float | None:
        looking = asyncio.create_task(
            whole_sent_log(values.database_url, watch, time.monotonic, Wakeup(), lambda: None)
        )
        try:
            await asyncio.to_thread(wait_until, lambda: gauge() == 1, 60, "the first look")
            with box.writer.engine.begin() as conn:
                conn.execute(sa.text("LOCK TABLE outbox_sent_journal IN ACCESS EXCLUSIVE MODE"))
                lose_the_log(postgresql_url)
                await asyncio.to_thread(wait_until, blocked, 60, "the rebuild under way")
                during = gauge()
            await asyncio.to_thread(wait_until, lambda: rebuilt(1), 60, "the rebuild")
            lose_the_log(postgresql_url)  # before the next look
            await asyncio.to_thread(wait_until, lambda: rebuilt(2), 60, "the second rebuild")
            return during
        finally:
            looking.cancel()
            await asyncio.gather(looking, return_exceptions=True)

    try:
        assert asyncio.run(scenario()) == 0, "claiming nothing while it rebuilds"
        assert gauge() == 1
        assert len(logged(caplog, "sent_log_rebuild")) == 2, "each loss warned of"
    finally:
        box.close()


@contextmanager
def private_server(directory: Path, acked: list[str], **options: str) -> Iterator[PostgresServer]:
    """A PostgreSQL server of its own (a test's crash leaves the others alone), with
    ``options`` set, its database ``outbox`` migrated and the messages ``acked`` relayed."""
    server = PostgresServer(directory, settings=[f"{k}={v}" for k, v in options.items()])
    server.start()
    try:
        server.create_database("outbox")
        url = server.url("outbox")
        migrate(url)
        box = Outbox(url)
        try:
            box.writer.enqueue([message(name) for name in acked])
            box.relay_all()
        finally:
            box.close()
        yield server
    finally:
        server.stop()


def test_a_relay_says_0_from_a_crash_until_the_log_is_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A relay's looks through a crash of PostgreSQL (an immediate stop, and a start): the
    relay says the log not complete while the server is down (the looks fail, and so would
    claims), warns of the emptied log, rebuilds it, and says it complete again."""
    caplog.set_level(logging.INFO)
    with private_server(tmp_path / "pg", ["m-1"]) as server:
        url = server.url("outbox")
        watch = SentLogWatch(60.0, time.monotonic())

        def gauge() -> int:
            return 1 if watch.complete else 0

        def rebuilt() -> bool:
            return bool(logged(caplog, "sent_log_rebuilt"))

        async def scenario() -> None:
            looking = asyncio.create_task(
                whole_sent_log(url, watch, time.monotonic, Wakeup(), lambda: None)
            )
            try:
                await asyncio.to_thread(wait_until, lambda: gauge() == 1, 60, "the first look")
                await asyncio.to_thread(server.stop, "immediate")
                await asyncio.to_thread(wait_until, lambda: gauge() == 0, 60, "a failed look")
                await asyncio.to_thread(server.start)
                await asyncio.to_thread(wait_until, rebuilt, 60, "the rebuild")
            finally:
                looking.cancel()
                await asyncio.gather(looking, return_exceptions=True)

        asyncio.run(scenario())
        assert gauge() == 1
        assert logged(caplog, "sent_log_failed") and logged(caplog, "sent_log_rebuild")
        assert statuses(url) == {"sent": 1}, "the entry back in the log"


def acked_over_a_lost_purge(box: Outbox) -> None:
    """A failover to an asynchronous standby loses the primary's last commits, a purge the
    relays had acted on among them: the old entry of "old" is back, while "old", written
    again past its horizon, was published meanwhile; then that publication is acked. "old"
    is journaled twice: 8 days ago and now."""
    sent_old_and_new(box)
    with box.writer.engine.connect() as conn:
        old_rows = [
            (table, [row._asdict() for row in conn.execute(sa.select(table))])
            for table in (outbox_sent, outbox_sent_journal)
        ]
    assert box.admin.purge(7 * DAY) == 1
    box.writer.enqueue([message("old")])
    (published,) = box.store.claim(10, NO_BYTE_LIMIT)
    assert not published.sent_before
    with box.writer.engine.begin() as conn:  # the purge undone, as by the failover
        for table, rows in old_rows:
            conn.execute(sa.delete(table))
            conn.execute(sa.insert(table), rows)
    box.store.settle(SettleBatch(sent=(published.id,)))


def test_an_ack_replaces_an_older_entry_of_its_key(postgresql_url: str) -> None:
    """The ack of an id whose older entry a failover brought back replaces that entry with
    its own and journals it, so that the next purge, of the old entry's journal row, leaves
    the id known for its new horizon."""
    box = Outbox(postgresql_url)
    try:
        acked_over_a_lost_purge(box)
        assert box.admin.purge(7 * DAY) == 1, "the old entry's journal row"
        box.writer.enqueue([message("old")])
        assert claimable(box.store) == [], "acked minutes ago: within its horizon"
    finally:
        box.close()


def test_a_downgrade_after_a_crash_keeps_the_latest_entry_of_a_key_journaled_twice(
    postgresql_url: str,
) -> None:
    """A downgrade of 0015 rebuilds a log a crash emptied, for the releases before, which
    read only the log. Of a key journaled twice it keeps the latest entry, as a relay's
    rebuild does: with the older one (sent 8 days ago), the release before's next purge
    forgot an id acked minutes before (an outside review)."""
    box = Outbox(postgresql_url)
    try:
        acked_over_a_lost_purge(box)
    finally:
        box.close()
    lose_the_log(postgresql_url)
    migrate(postgresql_url, "0014", downgrade=True, force=True)  # the box's lease lives on
    engine = sa.create_engine(postgresql_url)
    try:
        with engine.connect() as conn:
            ages = conn.execute(sa.text("SELECT now() - sent_at FROM outbox_sent")).scalars()
            assert sorted(age.days for age in ages) == [0, 0], "old's entry of today, and new's"
    finally:
        engine.dispose()


def test_a_crash_empties_the_sent_log_and_dedupe_stays_exact(tmp_path: Path) -> None:
    """PostgreSQL crashes (an immediate stop: no shutdown checkpoint) after three acks: its
    unlogged log comes back empty, the journal whole. No row is claimed until a relay's
    rebuild, and then the ids sent before the crash are dropped, a new one published."""
    with private_server(tmp_path / "pg", [f"m-{n}" for n in range(3)]) as server:
        url = server.url("outbox")
        server.stop("immediate")
        server.start()
        assert statuses(url) == {}, "the unlogged log is empty after the crash"
        box = Outbox(url)
        try:
            box.writer.enqueue([message("m-1"), message("m-3")])
            assert box.store.claim(10_000, NO_BYTE_LIMIT) == []
            assert rebuild(url) == 3
            assert claimable(box.store) == ["m-3"]
        finally:
            box.close()


def test_an_id_acked_after_a_crash_undid_the_purge_of_its_first_entry_stays_known(
    tmp_path: Path,
) -> None:
    """A message id acked 8 days ago is written again; the relay's retention purge deletes
    the old entry and its journal row, and a claim then takes the new row, not sent before,
    and publishes it. PostgreSQL crashes right after. Had the purge been seen before its
    commit was flushed (the relay's sessions commit so), the crash would undo it: the old
    journal row back, the rebuild copying the old entry into the log, the new row's ack
    finding its key logged and journaling nothing, and the next purge deleting the only
    entry of an id acked minutes before, to be published again when written again. The
    purge commits durably: the id stays known. (The WAL writer's period is its longest here,
    so that nothing but the purge's own commit would flush it before the crash.)"""
    with private_server(tmp_path / "pg", ["K"], wal_writer_delay="10000") as server:
        url = server.url("outbox")
        box = Outbox(url)
        with box.writer.engine.begin() as conn:  # durable
            sent_days_ago(conn, conn.execute(sa.select(outbox_sent.c.id)).scalar_one(), 8)
        box.writer.enqueue([message("K")])
        retention = OutboxAdmin(url, relay_session=True)  # the relay's own purge
        assert retention.purge(7 * DAY) == 1
        (published,) = box.store.claim(10, NO_BYTE_LIMIT)
        assert not published.sent_before
        server.stop("immediate")
        server.start()
        retention.close()
        try:
            rebuild(url)
            # Its broker ack, written now by the relay that claimed it (its process outlived
            # the database's crash).
            box.store.settle(SettleBatch(sent=(published.id,)))
            box.admin.purge(7 * DAY)
            box.writer.enqueue([message("K")])
            taken: list[str] = []
            with contextlib.suppress(StoreError):  # the claims' connection, the crash's
                taken = [r.message_id for r in box.store.claim(10, NO_BYTE_LIMIT)]
            taken += claimable(box.store)  # as the relay's retry goes on
            assert taken == [], "K was acked minutes ago: within its horizon"
        finally:
            box.close()
