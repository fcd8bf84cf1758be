"""Acked rows leave the outbox for the sent log (``keep_sent = ids``), and the outbox still
keeps its promises through it: a message id written again within the dedupe horizon is
never published again, whoever writes it and however; status counts the sent; the purge
ends the horizon."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from devtools.outbox import statuses
from relay.db.claims import ClaimStore
from relay.db.clock import database_time
from relay.db.outbox import OutboxAdmin, OutboxWriter
from relay.db.schema import outbox, outbox_sent
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
