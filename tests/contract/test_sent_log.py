"""Acked rows leave the outbox for the sent log (``keep_sent = ids``), and the outbox still
keeps its promises through it: a message id written again within the dedupe horizon is
never published again, whoever writes it and however, and after a crash that emptied the log
(PostgreSQL's is unlogged: ``relay.db.sentlog``); status counts the sent; the purge ends the
horizon."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from devtools.outbox import statuses
from devtools.servers import PostgresServer
from relay.db.claims import ClaimStore
from relay.db.clock import database_time
from relay.db.columns import sent_key_value
from relay.db.dialects import of
from relay.db.migrate import migrate
from relay.db.outbox import OutboxAdmin, OutboxWriter
from relay.db.schema import outbox, outbox_sent, outbox_sent_journal, outbox_sent_state
from relay.db.sentlog import SentLogRebuild
from relay.db.sink import OutboxSink
from relay.records import KEEP_IDS, KEEP_MESSAGES, PENDING, NewMessage, RowChange, SettleBatch
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
            relay.execute(box.store._settles._acked[0], {"ids": [row.id]})
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


def test_the_purge_ends_the_dedupe_horizon(box: Outbox) -> None:
    box.writer.enqueue([message("old"), message("new")])
    old, _new = box.relay_all()
    with box.writer.engine.begin() as conn:
        eight_days_ago = database_time(-8 * DAY)
        conn.execute(
            sa.update(outbox_sent).where(outbox_sent.c.id == old).values(sent_at=eight_days_ago)
        )
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


def rebuild(url: str, slice_entries: int = 100_000) -> int:
    """A relay's rebuild of the sent log, to the end: the entries it copied."""
    rebuilder = SentLogRebuild(url, slice_entries=slice_entries)
    try:
        copied = 0
        while (entries := rebuilder.step()) is not None:
            copied += entries
        assert rebuilder.complete()
        return copied
    finally:
        rebuilder.close()


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


def test_a_rebuild_in_slices_by_two_relays_copies_every_entry_once(
    postgresql_url: str,
) -> None:
    """Twenty acks of two entries and one of ten, slices of about three entries: two relays'
    rebuilds take turns, each slice where the other left off (the ten in one slice of their
    own), and every acked id is known again, no other."""
    box = Outbox(postgresql_url)
    try:
        acked = []
        for n in range(21):
            ids = [f"m-{n}-{k}" for k in range(10 if n == 7 else 2)]
            box.writer.enqueue([message(m) for m in ids])
            box.relay_all()
            acked += ids
        lose_the_log(postgresql_url)
        first, second = (SentLogRebuild(postgresql_url, slice_entries=3) for _ in range(2))
        slices = []
        try:
            while (step := first.step()) is not None:
                slices += [step, second.step() or 0]
        finally:
            first.close()
            second.close()
        assert sum(slices) == len(acked) == 50
        assert max(slices) == 10, "a row larger than a slice is a slice of its own"
        box.writer.enqueue([*(message(m) for m in acked), message("new")])
        assert claimable(box.store) == ["new"]
    finally:
        box.close()


def test_the_purge_ends_the_horizon_after_a_rebuild_too(postgresql_url: str) -> None:
    """The journal's rows of purged entries go with them: a rebuild after the purge brings
    back no id past the horizon."""
    box = Outbox(postgresql_url)
    try:
        for name in ("old", "new"):
            box.writer.enqueue([message(name)])
            box.relay_all()
        with box.writer.engine.begin() as conn:
            eight_days_ago = database_time(-8 * DAY)
            old = sent_key_value("old", conn.dialect)
            conn.execute(
                sa.update(outbox_sent)
                .where(outbox_sent.c.key == old)
                .values(sent_at=eight_days_ago)
            )
            journal = outbox_sent_journal
            conn.execute(
                sa.update(journal)
                .where(sa.literal(old, outbox_sent.c.key.type) == sa.any_(journal.c.message_keys))
                .values(sent_at=eight_days_ago)
            )
        assert box.admin.purge(7 * DAY) == 1
        lose_the_log(postgresql_url)
        assert rebuild(postgresql_url) == 1
        box.writer.enqueue([message("old"), message("new")])
        assert claimable(box.store) == ["old"]
    finally:
        box.close()


def test_a_crash_empties_the_sent_log_and_dedupe_stays_exact(tmp_path: Path) -> None:
    """PostgreSQL crashes (an immediate stop: no shutdown checkpoint) after three acks: its
    unlogged log comes back empty, the journal whole. No row is claimed until a relay's
    rebuild, and then the ids sent before the crash are dropped, a new one published."""
    server = PostgresServer(tmp_path / "pg")
    server.start()
    try:
        server.create_database("outbox")
        url = server.url("outbox")
        migrate(url)
        box = Outbox(url)
        box.writer.enqueue([message(f"m-{n}") for n in range(3)])
        box.relay_all()
        box.close()
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
    finally:
        server.stop()
