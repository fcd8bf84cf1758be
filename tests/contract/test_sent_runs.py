"""The sent log's runs on PostgreSQL (``relay.db.sentruns``): the journal sealed into runs in
key order and merged, so that after a crash claims wait only for the journal's tail to be
copied back, and dedupe stays exact meanwhile: an id in a run or in the tail, acked within
the horizon, is dropped; one the purge forgot, or never sent, is claimed."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from devtools.outbox import log_acked
from relay.db.clock import database_time
from relay.db.schema import outbox_sent_blocks, outbox_sent_journal, outbox_sent_runs
from relay.db.sentlog import SentLogRebuild
from relay.db.sentruns import MERGE_LOCK, SEAL_LOCK, SentRuns
from relay.errors import StoreError
from relay.sentlog import SentLogState
from tests.contract.test_sent_log import (
    DAY,
    Outbox,
    claimable,
    lose_the_log,
    message,
)

HOUR = 3600.0


def acked_ago(box: Outbox, message_id: str, hours: float, row_id: int) -> None:
    """An entry as an ack ``hours`` ago wrote it: in the log and a journal row of its own."""
    with box.writer.engine.begin() as conn:
        sent_at = conn.execute(sa.select(database_time(-hours * HOUR))).scalar_one()
        log_acked(conn, message_id, row_id, sent_at, sent_at)


def runs(box: Outbox) -> list[tuple[int, int]]:
    """(level, entries) of each run, oldest span first."""
    with box.writer.engine.connect() as conn:
        return [
            (r.level, r.entries)
            for r in conn.execute(
                sa.select(outbox_sent_runs.c.level, outbox_sent_runs.c.entries).order_by(
                    outbox_sent_runs.c.first_at
                )
            )
        ]


def test_the_journal_is_sealed_into_runs_merged_and_read_back_after_a_crash(
    postgresql_url: str,
) -> None:
    """Entries acked 9 to 1 hours ago, sealed an hour at a time (runs of level 0, merged
    two by two into level 1, and those into level 2) in blocks of 4 keys; one acked now,
    in the journal's tail. The log is lost: the latest run ended an hour ago, past
    ``SENT_TAIL_LOOKUP_MAX_S``, so no claim takes a row until the tail is copied back (a
    handful of entries, not the whole journal), and then every id acked, sealed or not, is
    dropped when written again, a new one claimed; the full copy then completes."""
    box = Outbox(postgresql_url)
    try:
        old = [f"old-{n}" for n in range(90)]
        for n, name in enumerate(old):
            acked_ago(box, name, 9 - n / 11.25, 1000 + n)  # 9 to 1 hours ago
        acked_ago(box, "now", 0, 5000)
        made = []
        for hours in range(8, 0, -1):  # an hour later each time (the margin one less)
            keeper = SentRuns(
                postgresql_url, settle_s=0.0, seal_s=HOUR, margin_s=hours * HOUR, fanin=2, block=4
            )
            try:
                made += keeper.maintain()
            finally:
                keeper.close()
        assert {m.level for m in made} == {0, 1, 2}
        kept = runs(box)
        assert sum(entries for _, entries in kept) == 90, kept
        assert kept[0][0] == 2, "the oldest merged furthest"
        with box.writer.engine.connect() as conn:
            widest = conn.execute(
                sa.select(sa.func.max(sa.func.cardinality(outbox_sent_blocks.c.message_keys)))
            ).scalar_one()
        assert widest == 4

        lose_the_log(postgresql_url)
        box.writer.enqueue([message(m) for m in (*old[::7], "now", "new")])
        assert claimable(box.store) == [], "the tail an hour long: copied first"
        rebuilder = SentLogRebuild(postgresql_url)
        try:
            assert rebuilder.recover() == 1, "the tail alone: the entry acked now"
            assert rebuilder.state() is SentLogState.RECOVERING
            assert claimable(box.store) == ["new"]
            assert rebuilder.rebuild() == 90, "the rest: the tail is in already"
            assert rebuilder.state() is SentLogState.COMPLETE
        finally:
            rebuilder.close()
        box.writer.enqueue([message(m) for m in (old[3], "newer")])
        assert claimable(box.store) == ["new", "newer"], "new: claimed, not acked, above"
    finally:
        box.close()


def test_a_first_seal_of_a_journal_days_old_is_sealed_a_level_1_span_at_a_time(
    postgresql_url: str,
) -> None:
    """The first upkeep after the relays were away for days seals the journal as runs of
    level 1 (not as runs of level 0 to be merged over and over), each in a transaction of
    its own and ending at the first entry past a level-1 span (4 hours here): an entry 3
    days ago and one 5 hours ago make two runs, not 17 of nothing between them."""
    box = Outbox(postgresql_url)
    keeper = SentRuns(
        postgresql_url, settle_s=0.0, seal_s=HOUR, margin_s=HOUR, fanin=4, top_level=2
    )
    try:
        acked_ago(box, "a", 3 * 24, 1)
        acked_ago(box, "b", 5, 2)
        assert keeper.step().more, "the rest of the tail is due at once"
        assert [m.level for m in keeper.maintain()] == [1]
        assert runs(box) == [(1, 1), (1, 1)]
        assert HOUR - 60 < keeper.unsealed_seconds() < HOUR + 60
    finally:
        keeper.close()
        box.close()


def test_a_merge_goes_a_range_of_keys_at_a_time_beside_seals_and_lookups(
    postgresql_url: str,
) -> None:
    """Eight runs of level 0 (240 entries, 30 an hour over eight hours), four merged into
    one of level 1 with about 13 entries a transaction: after its first range, the log is lost
    and its tail copied back, and every id acked is still dropped (the inputs answer for
    what the merge has not written); a seal goes through while another relay holds the
    merge's lock; another relay takes the merge on where it was, and the runs it replaced
    are swept, block by block. Every key is then in one run exactly once."""
    box = Outbox(postgresql_url)
    acked = [f"m-{n}" for n in range(240)]
    try:
        for n, name in enumerate(acked):
            acked_ago(box, name, 9 - n / 30, 1000 + n)
        for hours in range(8, 0, -1):
            sealer = SentRuns(
                postgresql_url, settle_s=0.0, seal_s=HOUR, margin_s=hours * HOUR, top_level=0
            )
            try:
                assert len(sealer.maintain()) == 1
            finally:
                sealer.close()
        assert [level for level, _ in runs(box)] == [0] * 8
        # 120 entries a merge, 13 a range: 10 ranges (a count not a power of two: an outside
        # review found a merge looped on its second range then).
        first = SentRuns(
            postgresql_url, settle_s=0.0, seal_s=HOUR, fanin=4, top_level=1, merge_chunk=13
        )
        # Sealing every half hour, up to now: the entry acked half an hour ago is due.
        second = SentRuns(
            postgresql_url,
            settle_s=0.0,
            seal_s=HOUR / 2,
            margin_s=0,
            fanin=4,
            top_level=1,
            merge_chunk=13,
        )
        try:
            begun = first.step()
            assert begun.more and not begun.made
            lose_the_log(postgresql_url)
            rebuilder = SentLogRebuild(postgresql_url)
            try:
                rebuilder.recover()
                assert rebuilder.state() is SentLogState.RECOVERING
            finally:
                rebuilder.close()
            box.writer.enqueue([message(m) for m in (*acked[::5], "new")])
            assert claimable(box.store) == ["new"]

            acked_ago(box, "late", 0.5, 5000)
            with first.engine.begin() as holder:
                holder.execute(sa.select(sa.func.pg_advisory_xact_lock(MERGE_LOCK)))
                sealed = second.step()
            assert [m.level for m in sealed.made] == [0]

            steps = 1
            while second.step().more:
                steps += 1
            assert steps > 5, "a range of keys at a time"
        finally:
            first.close()
            second.close()
        assert [level for level, _ in runs(box)] == [1, 1, 0], "8 merged 4 by 4, the new seal"
        with box.writer.engine.connect() as conn:
            keys = conn.execute(
                sa.select(sa.func.unnest(outbox_sent_blocks.c.message_keys))
            ).scalars()
            listed = list(keys)
            left = conn.execute(sa.select(outbox_sent_runs.c.merged_into)).scalars().all()
        assert len(listed) == len(set(listed)) == 241, "every entry once: no input left"
        assert left == [None, None, None]
        box.writer.enqueue([message(m) for m in (*acked[1::7], "late", "newer")])
        assert claimable(box.store) == ["new", "newer"], "new: claimed, not acked, above"
    finally:
        box.close()


def test_the_purge_leaves_a_merge_and_its_inputs_be_until_it_is_done(
    postgresql_url: str,
) -> None:
    """Four runs past a 7-day horizon (120 entries acked 9 to 8 days ago), a merge of them
    begun: the purge deletes their journal rows but neither the run being written nor its
    inputs (an outside review: a purge that deleted the run being written left the blocks
    the merge wrote next in no run, for ever). The merge then ends, and the next purge
    deletes the merged run: no block is left behind."""
    box = Outbox(postgresql_url)
    try:
        for n in range(120):
            acked_ago(box, f"old-{n}", 9 * 24 - n / 5, 1 + n)
        for quarter in (3, 2, 1, 0):  # six hours at a time
            margin = 8 * DAY + quarter * 6 * HOUR
            sealer = SentRuns(
                postgresql_url, settle_s=0.0, seal_s=HOUR, margin_s=margin, top_level=0
            )
            try:
                assert len(sealer.maintain()) == 1
            finally:
                sealer.close()
        merger = SentRuns(
            postgresql_url,
            settle_s=0.0,
            seal_s=HOUR,
            margin_s=8 * DAY,
            fanin=4,
            top_level=1,
            merge_chunk=13,
        )
        try:
            assert merger.step().more
            assert box.admin.purge(7 * DAY) == 120, "the journal's rows alone"
            kept = sorted(runs(box))
            assert [level for level, _ in kept] == [0, 0, 0, 0, 1]
            assert sum(entries for level, entries in kept if level == 0) == 120
            assert 0 < merger_written(box) < 120, "the merge under way"
            assert [m.entries for m in merger.maintain()] == [120]
        finally:
            merger.close()
        assert box.admin.purge(7 * DAY) == 120, "the merged run's entries"
        assert runs(box) == []
        with box.writer.engine.connect() as conn:
            left = conn.execute(sa.select(sa.func.count()).select_from(outbox_sent_blocks))
            assert left.scalar_one() == 0
    finally:
        box.close()


def merger_written(box: Outbox) -> int:
    """The entries the run being merged holds so far."""
    with box.writer.engine.connect() as conn:
        written = conn.execute(
            sa.select(outbox_sent_runs.c.entries).where(outbox_sent_runs.c.building)
        ).scalar_one()
    return int(written)


def test_a_run_remembers_nothing_the_journals_purge_forgot(postgresql_url: str) -> None:
    """An entry acked 8 days ago and one 6 days ago, sealed into one run; the purge at a
    7-day horizon deletes the older one's journal row (the run lives on: its span ends
    inside the horizon). After a crash, while the runs answer, the older id written again
    is new, as it is once the log is whole; the younger is dropped."""
    box = Outbox(postgresql_url)
    keeper = SentRuns(postgresql_url, settle_s=0.0, seal_s=DAY, margin_s=HOUR, fanin=16)
    try:
        acked_ago(box, "eight-days", 8 * 24, 1)
        acked_ago(box, "six-days", 6 * 24, 2)
        assert [m.level for m in keeper.maintain()] == [0]
        assert box.admin.purge(7 * DAY) == 1
        assert runs(box) == [(0, 2)], "the run's span ends inside the horizon"
        lose_the_log(postgresql_url)
        rebuilder = SentLogRebuild(postgresql_url)
        try:
            assert rebuilder.recover() == 0
        finally:
            rebuilder.close()
        box.writer.enqueue([message("eight-days"), message("six-days")])
        assert claimable(box.store) == ["eight-days"]
    finally:
        keeper.close()
        box.close()


def test_the_purge_deletes_runs_whose_span_ended_past_the_horizon(postgresql_url: str) -> None:
    """Five entries acked 9 days ago, sealed as one run, and one 2 hours ago, as another:
    the purge at a 7-day horizon deletes the first run's blocks with the journal's rows,
    and leaves the second."""
    box = Outbox(postgresql_url)
    try:
        for n in range(5):
            acked_ago(box, f"m-{n}", 9 * 24 - n, n + 1)
        acked_ago(box, "young", 2, 10)
        for margin in (8 * DAY, HOUR):  # eight days ago, then an hour ago
            keeper = SentRuns(postgresql_url, settle_s=0.0, seal_s=HOUR, margin_s=margin, fanin=16)
            try:
                assert len(keeper.maintain()) == 1
            finally:
                keeper.close()
        assert [entries for _, entries in runs(box)] == [5, 1]
        assert box.admin.purge(7 * DAY) == 10, "5 journal entries, 5 of the run's"
        assert [entries for _, entries in runs(box)] == [1]
        with box.writer.engine.connect() as conn:
            left = conn.execute(sa.select(sa.func.count()).select_from(outbox_sent_journal))
            assert left.scalar_one() == 1
            blocks = conn.execute(sa.select(sa.func.count()).select_from(outbox_sent_blocks))
            assert blocks.scalar_one() == 1
    finally:
        box.close()


def test_one_relay_keeps_the_runs_at_a_time(postgresql_url: str) -> None:
    """Two relays' upkeep at once: the one that holds the lock seals; the other does
    nothing (no run made twice)."""
    box = Outbox(postgresql_url)
    first = SentRuns(postgresql_url, settle_s=0.0, seal_s=HOUR, margin_s=HOUR, fanin=16)
    second = SentRuns(postgresql_url, settle_s=0.0, seal_s=HOUR, margin_s=HOUR, fanin=16)
    try:
        acked_ago(box, "m", 5, 1)
        with first.engine.begin() as holder:
            holder.execute(sa.select(sa.func.pg_advisory_xact_lock(SEAL_LOCK)))
            assert second.maintain() == []
        assert [m.level for m in second.maintain()] == [0]
        assert runs(box) == [(0, 1)]
    finally:
        first.close()
        second.close()
        box.close()


def test_claims_on_a_store_that_never_recovered_look_the_runs_and_the_tail_up(
    postgresql_url: str,
) -> None:
    """A lost log, never copied back (no relay has recovered it: the state row is gone): a
    claim takes rows all the same, each id looked up in the runs and in the journal's
    tail, at one snapshot. An id in a run and one in the tail are dropped, one acked since
    the crash too (in the log and the tail), and a new one is claimed."""
    box = Outbox(postgresql_url)
    keeper = SentRuns(postgresql_url, settle_s=0.0, seal_s=60.0, margin_s=60.0, fanin=16)
    try:
        acked_ago(box, "in-a-run", 0.05, 1)  # 3 minutes ago: sealed up to a minute ago
        keeper.maintain()
        acked_ago(box, "in-the-tail", 0, 2)
        lose_the_log(postgresql_url)
        acked_ago(box, "since-the-crash", 0, 3)
        box.writer.enqueue(
            [message(m) for m in ("in-a-run", "in-the-tail", "since-the-crash", "fresh")]
        )
        assert claimable(box.store) == ["fresh"]
        rebuilder = SentLogRebuild(postgresql_url)
        try:
            assert rebuilder.state() is SentLogState.INCOMPLETE
        finally:
            rebuilder.close()
    finally:
        keeper.close()
        box.close()


def test_claims_after_a_restore_look_up_a_short_tail_however_old(postgresql_url: str) -> None:
    """A server restored from a backup taken hours ago: its latest run ended then, and its
    journal's tail is the minutes before the backup. Claims waited for the tail's copy (the
    run's end was measured against now: an outside review's restore paused 12 s); the
    tail's span is its own, from the run's end to its last entry: looked up meanwhile."""
    box = Outbox(postgresql_url)
    keeper = SentRuns(postgresql_url, settle_s=0.0, seal_s=HOUR, margin_s=2 * HOUR, fanin=16)
    try:
        acked_ago(box, "in-a-run", 3, 1)  # sealed: the run ends two hours ago
        keeper.maintain()
        acked_ago(box, "in-the-tail", 1.95, 2)  # three minutes after the run's end
        lose_the_log(postgresql_url)
        box.writer.enqueue([message(m) for m in ("in-a-run", "in-the-tail", "fresh")])
        assert claimable(box.store) == ["fresh"]
    finally:
        keeper.close()
        box.close()


def test_a_tail_lookup_that_fails_leaves_no_row_held(
    postgresql_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lookup of a claim's ids in the tail fails (the database crashed again, its
    connection killed, a statement timeout): the claim fails and holds none of its rows.
    Held, no claim of this relay took them again, nor another relay's while it held their
    buckets (an outside review: 10 to 70 rows stranded a second crash)."""
    box = Outbox(postgresql_url)
    keeper = SentRuns(postgresql_url, settle_s=0.0, seal_s=60.0, margin_s=60.0, fanin=16)
    try:
        acked_ago(box, "in-a-run", 0.05, 1)
        keeper.maintain()
        lose_the_log(postgresql_url)
        box.writer.enqueue([message(m) for m in ("in-a-run", "fresh")])
        failing = sa.text("SELECT id FROM no_such_table")
        with monkeypatch.context() as patched:
            patched.setattr(box.store, "_tail_sent_statement", failing)
            with pytest.raises(StoreError):
                box.store.claim(10_000, 2**40)
        assert claimable(box.store) == ["fresh"]
    finally:
        keeper.close()
        box.close()


def test_claims_on_a_lost_log_without_runs_take_nothing(postgresql_url: str) -> None:
    """Without a run the journal's tail is the whole journal, too long to look up a claim
    at a time: a lost log then takes no row until it is copied back whole (and then the
    new one)."""
    box = Outbox(postgresql_url)
    try:
        acked_ago(box, "m", 5, 1)
        lose_the_log(postgresql_url)
        box.writer.enqueue([message("m"), message("fresh")])
        assert claimable(box.store) == []
        rebuilder = SentLogRebuild(postgresql_url)
        try:
            assert rebuilder.rebuild() == 1
        finally:
            rebuilder.close()
        assert claimable(box.store) == ["fresh"]
    finally:
        box.close()


def test_an_ack_after_the_clock_went_back_is_in_the_tail_copied_back(
    postgresql_url: str,
) -> None:
    """The runs were sealed up to a time the database's clock has not reached (a failover
    to a standby whose clock is 10 minutes behind): an id acked now is journaled at the
    runs' end, not before it, so that after the next crash it is in the tail copied back
    and dropped when written again (an outside review: journaled at the clock's time, it
    was in no run and no tail, and published again)."""
    box = Outbox(postgresql_url)
    ahead = SentRuns(
        postgresql_url, settle_s=0.0, seal_s=1.0, margin_s=-600.0
    )  # sealed 10 minutes ahead
    try:
        acked_ago(box, "old", 5, 1)
        assert [m.entries for m in ahead.maintain()] == [1]
        box.writer.enqueue([message("after-failover")])
        box.relay_all()
        lose_the_log(postgresql_url)
        rebuilder = SentLogRebuild(postgresql_url)
        try:
            assert rebuilder.recover() == 1, "the ack after the failover, in the tail"
        finally:
            rebuilder.close()
        box.writer.enqueue([message("after-failover"), message("old"), message("fresh")])
        assert claimable(box.store) == ["fresh"]
    finally:
        ahead.close()
        box.close()


def test_an_ack_in_flight_as_the_clock_steps_past_the_margin_is_sealed_by_a_later_seal(
    postgresql_url: str,
) -> None:
    """The database's clock stepped forward past the margin while an ack was in flight (here:
    a margin of 0, the ack's transaction open across the seal's look). A seal goes only as
    far as a time the database read a settle time before by the relay's monotonic clock, so
    the entry, committed since, is in the next seal's run, and after a crash its id is
    dropped when written again (sealed up to the database's time less the margin, the
    entry was in no run and in no tail, and published again)."""
    settle = 1.0
    box = Outbox(postgresql_url)
    # A seal of a minute's span or more, all of it one run of level 0.
    keeper = SentRuns(postgresql_url, settle_s=settle, seal_s=60.0, margin_s=0.0, fanin=10**6)
    try:
        acked_ago(box, "old", 2 / 60, 1)
        with box.writer.engine.connect() as conn:
            ack = conn.begin()
            sent_at = conn.execute(sa.select(database_time())).scalar_one()
            log_acked(conn, "in-flight", 2, sent_at, sent_at)
            assert keeper.maintain() == [], "no time read a settle time ago"
            ack.commit()
        time.sleep(settle)
        assert [m.entries for m in keeper.maintain()] == [2]
        lose_the_log(postgresql_url)
        rebuilder = SentLogRebuild(postgresql_url)
        try:
            rebuilder.recover()
        finally:
            rebuilder.close()
        box.writer.enqueue([message("in-flight"), message("old"), message("fresh")])
        assert claimable(box.store) == ["fresh"]
    finally:
        keeper.close()
        box.close()


def test_the_unsealed_part_of_the_journal_is_told_in_seconds(postgresql_url: str) -> None:
    """What ``relay_sent_log_unsealed_seconds`` says: back to the journal's oldest entry
    before any seal, back to the latest run's end after one."""
    box = Outbox(postgresql_url)
    keeper = SentRuns(postgresql_url, settle_s=0.0, seal_s=HOUR, margin_s=HOUR, fanin=16)
    try:
        assert keeper.unsealed_seconds() == 0.0
        acked_ago(box, "m", 5, 1)
        assert 5 * HOUR - 60 < keeper.unsealed_seconds() < 5 * HOUR + 60
        keeper.maintain()
        assert HOUR - 60 < keeper.unsealed_seconds() < HOUR + 60
    finally:
        keeper.close()
        box.close()
