"""The sent log's runs (PostgreSQL, where the log is journaled): the journal's entries sealed
in key order, merged as they pile up, looked up by claims while the log is rebuilt after a
crash, and purged at the horizon.

Why: the log is UNLOGGED (``relay.db.schema.outbox_sent_journal`` says why), so a crash or a
failover empties it, and a rebuild copies about 400,000 entries a second: a week's log at
2,000 acks a second (1.2 billion entries) took about 50 minutes, and claims waited for it.
A run is what a B-tree's random inserts cannot be without their WAL: the entries of a span
of sent times, sorted once and written once, in blocks of ``SENT_RUN_BLOCK`` keys found by
their first key (a block a few hundred bytes under PostgreSQL's TOAST threshold: one heap
page read a lookup). After a crash, a relay copies into the log only the entries of the
journal's tail no run holds (the last ``SENT_RUN_SEAL_S`` or so: seconds), and claims look
a key up in the log and in each run (``looked_up``, one probe of a block per run) until the
whole log is copied back.

Sealing takes one relay at a time, and merging one (transaction-scoped advisory locks of
their own): every ``SENT_RUN_SEAL_S`` the journal's entries sent up to
``SENT_RUN_MARGIN_S`` ago (every ack that sent them has committed or failed by then: its
statements are bounded; ago by the relay's monotonic clock too, ``relay.sealing``) become
a run of level 0; ``SENT_RUN_FANIN`` runs of one level become one of the next, up to
``SENT_RUN_TOP_LEVEL``, so that a week's log is a few dozen runs and each entry is written
about three times more, a few dozen bytes each. A merge writes ``SENT_RUN_MERGE_CHUNK``
entries a transaction, a range of keys at a time, and seals go on between (a merge of the
top level at 2,000 acks a second is 61 million entries).

A run's entries keep their sent times: a lookup counts only those the journal still holds
(sent at or after its oldest row), so that a run whose span straddles the horizon remembers
nothing the purge forgot.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from relay.constants import (
    SENT_RUN_BLOCK,
    SENT_RUN_FANIN,
    SENT_RUN_MARGIN_S,
    SENT_RUN_MERGE_CHUNK,
    SENT_RUN_SEAL_S,
    SENT_RUN_TOP_LEVEL,
)
from relay.db.clock import database_time, seconds_since
from relay.db.columns import sent_key
from relay.db.dialects import of
from relay.db.engine import create_engine, db_errors
from relay.db.schema import outbox, outbox_sent_blocks, outbox_sent_journal, outbox_sent_runs
from relay.db.sentblocks import Made, Upkeep, finished, write_blocks
from relay.db.sentlog import first_unsealed, unnested
from relay.db.sentmerge import Merge
from relay.redact import redact_url
from relay.sealing import SealBound

_RUNS = outbox_sent_runs
_BLOCKS = outbox_sent_blocks
_JOURNAL = outbox_sent_journal
# The advisory locks sealers and mergers take (constants other tools are unlikely to use).
SEAL_LOCK = 0x6F75_7462_7275_6E73  # "outbruns"
MERGE_LOCK = 0x6F75_7462_6D72_6765  # "outbmrge"


def _oldest_journaled() -> sa.ScalarSelect[Any]:
    """The journal's oldest sent time: what the purge has not gone past."""
    return sa.select(sa.func.min(_JOURNAL.c.sent_at)).scalar_subquery()


def _tail_start() -> sa.ColumnElement[Any]:
    """Where the journal's unsealed tail begins: the latest run's end, or with no run the
    journal's oldest entry (None with neither)."""
    return sa.func.coalesce(first_unsealed(), _oldest_journaled())


def looked_up(key: sa.ColumnElement[Any]) -> sa.ColumnElement[bool]:
    """Whether a run holds ``key`` with a sent time the journal still holds: in each run
    whose span ends after the journal's oldest row, the block of the greatest first key at
    most ``key`` (its index walked backwards, one block read), and ``key`` in it."""
    oldest = _oldest_journaled()
    block = (
        sa.select(_BLOCKS.c.message_keys, _BLOCKS.c.sent_at)
        .where(_BLOCKS.c.run == _RUNS.c.run, _BLOCKS.c.first_key <= key)
        .order_by(_BLOCKS.c.first_key.desc())
        .limit(1)
        .correlate_except(_BLOCKS)  # the run, and the claim's row whose key it is
        .lateral("block")
    )
    place = sa.func.array_position(block.c.message_keys, key)
    return sa.exists(
        sa.select(sa.literal(1))
        .select_from(_RUNS.join(block, sa.true()))
        .where(_RUNS.c.upto > oldest, block.c.sent_at[place] >= oldest)
    )


def tail_sent(dialect: sa.Dialect) -> sa.CompoundSelect[int]:
    """Of the rows bound by id as ``ids`` (claimed while the log is incomplete, their dedupe
    unknown: ``relay.db.due``), those whose message id was sent within the horizon: held by
    a run (``looked_up``), or by the journal's unsealed tail, from the latest run's end on
    (what the copy back has not committed yet, and every ack since the crash). One
    statement, one snapshot: a seal between two would move entries from the tail into a
    run that neither saw. The tail is read once, each entry's key probing a hash of the
    few claimed keys, not looked up a key at a time: a claim then costs a pass over the
    tail (``relay.db.sentlog.claimable`` bounds its age), not a pause for its copy."""
    claimed = (
        sa.select(outbox.c.id, sent_key(outbox.c.message_id).label("key"))
        .where(of(dialect).id_in(outbox.c.id))
        .cte("claimed")
    )
    in_runs = sa.select(claimed.c.id).where(looked_up(claimed.c.key))
    entry = unnested(_JOURNAL, ("key",))
    in_tail = (
        sa.select(claimed.c.id)
        .select_from(_JOURNAL.join(entry, sa.true()).join(claimed, claimed.c.key == entry.c.key))
        .where(_JOURNAL.c.sent_at >= first_unsealed())
    )
    return sa.union(in_runs, in_tail)


class SentRuns:
    """The runs' upkeep (``step``), in the relay's bounded sessions but for the runs' own
    statements. Nothing where the log is not journaled (it has no runs).

    A seal and a merge take locks of their own: a merge of the top level takes minutes, a
    range of keys per transaction, and seals go on meanwhile. A merge's state is in its
    rows (``outbox_sent_runs``: the run it writes is ``building``, and its
    inputs name it), so that whichever relay takes the lock next goes on with it."""

    def __init__(
        self,
        url: str,
        *,
        seal_s: float = SENT_RUN_SEAL_S,
        margin_s: float = SENT_RUN_MARGIN_S,
        settle_s: float = SENT_RUN_MARGIN_S,
        fanin: int = SENT_RUN_FANIN,
        top_level: int = SENT_RUN_TOP_LEVEL,
        block: int = SENT_RUN_BLOCK,
        merge_chunk: int = SENT_RUN_MERGE_CHUNK,
    ) -> None:
        self.engine = create_engine(url, relay_session=True)
        self._where = redact_url(url)
        self._journaled = of(self.engine).journals_sent_log
        self.seal_s, self.fanin, self.top_level = seal_s, fanin, top_level
        self._bound = SealBound(margin_s, settle_s)
        self.block = block
        self._merge = Merge(fanin=fanin, top_level=top_level, block=block, chunk=merge_chunk)

    def step(self) -> Upkeep:
        """Seal the journal's tail if a span is due, and take a merge one step on: each in a
        transaction of its own, neither while another relay holds its lock."""
        if not self._journaled:
            return Upkeep()
        with db_errors("sent log runs", self._where):
            return self._locked(SEAL_LOCK, self._seal) + self._locked(MERGE_LOCK, self._merge.step)

    def maintain(self) -> list[Made]:
        """Every step due now (a tool's, a test's: the relay takes them one at a time,
        ``relay.sentlog_tasks.keep_sent_runs``); the runs finished."""
        made: list[Made] = []
        while True:
            upkeep = self.step()
            made += upkeep.made
            if not upkeep.more:
                return made

    def unsealed_seconds(self) -> float:
        """How far back the journal's tail reaches: the seconds from the latest run's end (or
        the journal's oldest entry, with no run) to now; what a crash would copy back before
        claims go on. 0 with nothing unsealed, or where the log is not journaled."""
        if not self._journaled:
            return 0.0
        since = _tail_start()
        with db_errors("sent log runs", self._where), self.engine.connect() as conn:
            seconds = conn.execute(sa.select(seconds_since(since))).scalar_one()
        return max(0.0, float(seconds or 0.0))

    def close(self) -> None:
        self.engine.dispose()

    def _locked(self, lock: int, work: Callable[[sa.Connection], Upkeep]) -> Upkeep:
        with self.engine.begin() as conn:
            if not conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(lock))).scalar():
                return Upkeep()
            # A step sorts up to a level-1 span's entries (the first seal after hours of
            # acks) in one statement: as long as it takes, ended with its relay
            # (``Dialect.unbounded``).
            of(conn).unbounded(conn)
            return work(conn)

    def _seal(self, conn: sa.Connection) -> Upkeep:
        """The journal's entries sent from the tail's start to ``margin_s`` ago (by both
        clocks: ``relay.sealing``) as a run, once that span is ``seal_s`` long: of level 0,
        or, where its entries span a level-1 run's length or more (the first seal after the
        relays were away for hours), as a run of level 1 that ends at the first entry past
        that length, the rest left to the next."""
        first_at, now = conn.execute(sa.select(_tail_start(), database_time())).one()
        upto = self._bound.read(time.monotonic(), now)
        if first_at is None or upto is None or first_at > upto - timedelta(seconds=self.seal_s):
            return Upkeep()
        level, end = 0, upto
        first_entry = self._first_sent(conn, first_at, upto)
        widest = timedelta(seconds=self.seal_s * self.fanin)
        if first_entry is not None and first_entry + widest < upto:
            end = self._first_sent(conn, first_entry + widest, upto) or upto
            level = min(1, self.top_level)
        entry = unnested(_JOURNAL, ("key",))
        entries = (
            sa.select(entry.c.key, _JOURNAL.c.sent_at)
            .select_from(_JOURNAL.join(entry, sa.true()))
            .where(_JOURNAL.c.sent_at >= first_at, _JOURNAL.c.sent_at < end)
        )
        run = conn.execute(
            sa.insert(_RUNS)
            .values(level=level, first_at=first_at, upto=end, entries=0)
            .returning(_RUNS.c.run)
        ).scalar_one()
        count = write_blocks(conn, entries, run, self.block)
        return Upkeep((finished(conn, run, level, count),), more=end < upto)

    @staticmethod
    def _first_sent(conn: sa.Connection, since: Any, before: Any) -> Any:
        """The sent time of the journal's first entry from ``since`` to ``before``, if any."""
        return conn.execute(
            sa.select(sa.func.min(_JOURNAL.c.sent_at)).where(
                _JOURNAL.c.sent_at >= since, _JOURNAL.c.sent_at < before
            )
        ).scalar()


def purge_chunk(cutoff: sa.ColumnElement[Any], chunk: int) -> Callable[[sa.Connection], int]:
    """One transaction's purge of the runs whose span ended before ``cutoff``: the blocks of
    about ``chunk`` of their entries, then the runs left with none. The entries purged. A
    lookup meanwhile counts none of their entries: the journal's own purge has gone past
    them. Not a run a merge is writing, nor its inputs, until it is done (an outside review:
    a purge that deleted a run being written left the blocks the merge wrote next in no run,
    for ever; one that deleted some of its blocks sent the merge back over keys written).
    """
    merging = _RUNS.alias("merging")
    settled = (
        _RUNS.c.upto < cutoff,
        ~_RUNS.c.building,
        ~sa.exists().where(merging.c.run == _RUNS.c.merged_into, merging.c.building),
    )
    expired = sa.select(_RUNS.c.run).where(*settled)
    doomed = (
        sa.select(_BLOCKS.c.run, _BLOCKS.c.first_key)
        .where(_BLOCKS.c.run.in_(expired))
        .limit(max(1, chunk // SENT_RUN_BLOCK))
    )
    gone = (
        sa.delete(_BLOCKS)
        .where(sa.tuple_(_BLOCKS.c.run, _BLOCKS.c.first_key).in_(doomed))
        .returning(sa.func.cardinality(_BLOCKS.c.message_keys))
    )
    empty = sa.delete(_RUNS).where(*settled, ~sa.exists().where(_BLOCKS.c.run == _RUNS.c.run))

    def one_chunk(conn: sa.Connection) -> int:
        purged = sum(conn.execute(gone).scalars())
        conn.execute(empty)
        return int(purged)

    return one_chunk
