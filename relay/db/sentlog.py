"""The sent log's retention on PostgreSQL: two partitions, emptied whole in turn.

Acks log into the current partition (``outbox_counters``' ``sent_slot`` row says which). The
retention (``rotate``) empties the other one with TRUNCATE once every entry in it is older
than the retention, and makes the emptied one current once the current one's oldest entry is
older than the retention. So an entry is kept at least the retention and at most about twice
it (the purge's interval more), whether acks keep coming or not.

Deleting old entries in chunks, as the log is purged on the other databases, cost about what
logging them did: a DELETE record per entry, and autovacuum then cleaned the key index, whose
entries lie anywhere in it, taking a full-page image of each page it touched first after a
checkpoint. bench.soak at 2,000 rows/s with a 3-minute retention, before: WAL for relaying
0.66x the INSERTs' before the purge started, 0.78x once it ran; PostgreSQL's CPU for the relays
+31%. TRUNCATE writes nothing per entry and leaves nothing to vacuum.

What it costs: the log holds up to twice a retention's entries, and a claim probes both
partitions for each row it claims (3.8 against 1.9 us of PostgreSQL's CPU per row probed, a
million entries; with three partitions 10.5 us, with eight 26.5: the probe cannot know which
partition holds a message id, so the ring stays at two).

Safe whatever the relays' clocks and however many rotate at once: the rotation takes the
``sent_slot`` row's lock (rotations take turns), then the lock of the partition it empties
(ACCESS EXCLUSIVE: claims reading it and acks logging into it finish first, and the next
ones wait the moment TRUNCATE takes), and checks, under those locks, that every entry in it
is older than the retention. An ack that read the slot before a rotation and logs into the
partition that stopped being current has either committed (its entry is young: nothing is
emptied), or waits for the lock and logs after.
"""

from __future__ import annotations

import sqlalchemy as sa

from relay.constants import SENT_ROTATE_LOCK_MS
from relay.db.clock import database_time
from relay.db.schema import SENT_PARTITIONS, SENT_SLOT, SENT_SLOTS, outbox_counters, outbox_sent

_SLOT_ROW = outbox_counters.c.name == SENT_SLOT


def current_slot() -> sa.ScalarSelect[int]:
    """The partition acks log into, in SQL (one read of a small table per statement)."""
    return sa.select(outbox_counters.c.value).where(_SLOT_ROW).scalar_subquery()


def rotate(conn: sa.Connection, older_than: float) -> int:
    """In ``conn``'s transaction: empty the partition acks do not log into if every entry in
    it is older than ``older_than`` seconds; then, if it is empty and the current one's
    oldest entry is older than that, make it the current one. Returns how many entries it
    dropped."""
    conn.execute(sa.text(f"SET LOCAL lock_timeout = {SENT_ROTATE_LOCK_MS}"))
    current = conn.execute(
        sa.select(outbox_counters.c.value).where(_SLOT_ROW).with_for_update()
    ).scalar_one()
    other = (current + 1) % SENT_SLOTS
    cutoff = database_time(-older_than)
    dropped = 0
    if conn.execute(sa.select(sa.exists().where(outbox_sent.c.slot == other))).scalar():
        partition = SENT_PARTITIONS[other]
        conn.execute(sa.text(f"LOCK TABLE {partition} IN ACCESS EXCLUSIVE MODE"))
        young = sa.exists().where(outbox_sent.c.slot == other, outbox_sent.c.sent_at >= cutoff)
        if conn.execute(sa.select(young)).scalar():
            return 0  # logged into after it stopped being the current one: not yet
        count = sa.select(sa.func.count()).select_from(outbox_sent)
        dropped = int(conn.execute(count.where(outbox_sent.c.slot == other)).scalar_one())
        conn.execute(sa.text(f"TRUNCATE {partition}"))
    oldest = sa.select(sa.func.min(outbox_sent.c.sent_at)).where(outbox_sent.c.slot == current)
    if conn.execute(sa.select(oldest.scalar_subquery() < cutoff)).scalar():
        conn.execute(sa.update(outbox_counters).where(_SLOT_ROW).values(value=other))
    return dropped
