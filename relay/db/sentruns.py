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
statements are bounded) become a run of level 0; ``SENT_RUN_FANIN`` runs of one level
become one of the next, up to ``SENT_RUN_TOP_LEVEL``, so that a week's log is a few dozen
runs and each entry is written about three times more, a few dozen bytes each. A merge
writes ``SENT_RUN_MERGE_CHUNK`` entries a transaction, a range of keys at a time, and seals
go on between (a merge of the top level at 2,000 acks a second is 300 million entries).

A run's entries keep their sent times: a lookup counts only those the journal still holds
(sent at or after its oldest row), so that a run whose span straddles the horizon remembers
nothing the purge forgot.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from relay.constants import (
    SENT_RUN_BLOCK,
    SENT_RUN_FANIN,
    SENT_RUN_MARGIN_S,
    SENT_RUN_MERGE_CHUNK,
    SENT_RUN_SEAL_S,
    SENT_RUN_TOP_LEVEL,
)
from relay.db.clock import database_time, seconds_since
from relay.db.dialects import of
from relay.db.engine import create_engine, db_errors
from relay.db.schema import outbox_sent_blocks, outbox_sent_journal, outbox_sent_runs
from relay.db.sentlog import first_unsealed, unnested
from relay.redact import redact_url

log = logging.getLogger(__name__)

_RUNS = outbox_sent_runs
_BLOCKS = outbox_sent_blocks
_JOURNAL = outbox_sent_journal
# The advisory locks sealers and mergers take (constants other tools are unlikely to use).
SEAL_LOCK = 0x6F75_7462_7275_6E73  # "outbruns"
MERGE_LOCK = 0x6F75_7462_6D72_6765  # "outbmrge"
# The least key: where the first range of a merge's input begins.
_FIRST_KEY = str(uuid.UUID(int=0))


@dataclass(frozen=True)
class Made:
    """A run made: its level and entries."""

    level: int
    entries: int


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


@dataclass(frozen=True)
class Upkeep:
    """One step of the runs' upkeep: the runs it finished, and whether more is due at once
    (the rest of a long tail, a level-1 span at a time; a merge's next range of keys)."""

    made: tuple[Made, ...] = ()
    more: bool = False

    def __add__(self, other: Upkeep) -> Upkeep:
        return Upkeep(self.made + other.made, self.more or other.more)


def key_bound(index: int, chunks: int) -> str:
    """The first key of the ``index``-th of ``chunks`` equal ranges of keys (uuids; a key is
    a message id's MD5, so that equal ranges hold about as many keys each)."""
    return str(uuid.UUID(int=(index << 128) // chunks))


def next_bound(after: str | None, chunks: int) -> str | None:
    """The end of the range of keys a merge writes after the key ``after`` (None: from the
    first key): the first bound of ``chunks`` ranges past it, or None past the last."""
    index = 0 if after is None else (uuid.UUID(after).int * chunks) >> 128
    return key_bound(index + 1, chunks) if index + 1 < chunks else None


class SentRuns:
    """The runs' upkeep (``step``), in the relay's bounded sessions but for the runs' own
    statements. Nothing where the log is not journaled (it has no runs).

    A seal and a merge take locks of their own: a merge of the top level takes minutes, a
    range of keys per transaction, and seals go on meanwhile. A merge's state is in its
    rows (``outbox_sent_runs``: the run it writes has no count of entries yet, and its
    inputs name it), so that whichever relay takes the lock next goes on with it."""

    def __init__(
        self,
        url: str,
        *,
        seal_s: float = SENT_RUN_SEAL_S,
        margin_s: float = SENT_RUN_MARGIN_S,
        fanin: int = SENT_RUN_FANIN,
        top_level: int = SENT_RUN_TOP_LEVEL,
        block: int = SENT_RUN_BLOCK,
        merge_chunk: int = SENT_RUN_MERGE_CHUNK,
    ) -> None:
        self.engine = create_engine(url, relay_session=True)
        self._where = redact_url(url)
        self._journaled = of(self.engine).journals_sent_log
        self.seal_s, self.margin_s, self.fanin, self.top_level = seal_s, margin_s, fanin, top_level
        self.block, self.merge_chunk = block, merge_chunk

    def step(self) -> Upkeep:
        """Seal the journal's tail if a span is due, and take a merge one step on: each in a
        transaction of its own, neither while another relay holds its lock."""
        if not self._journaled:
            return Upkeep()
        with db_errors("sent log runs", self._where):
            return self._locked(SEAL_LOCK, self._seal) + self._locked(MERGE_LOCK, self._merge)

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
        """The journal's entries sent from the tail's start to ``margin_s`` ago as a run, once
        that span is ``seal_s`` long: of level 0, or, where its entries span a level-1 run's
        length or more (the first seal after the relays were away for hours), as a run of
        level 1 that ends at the first entry past that length, the rest left to the next."""
        start = _tail_start()
        first_at, upto, due = conn.execute(
            sa.select(
                start.label("first_at"),
                database_time(-self.margin_s).label("upto"),
                (start <= database_time(-self.margin_s - self.seal_s)).label("due"),
            )
        ).one()
        if first_at is None or not due:
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
        count = self._write(conn, entries, run)
        return Upkeep((self._finished(conn, run, level, count),), more=end < upto)

    @staticmethod
    def _first_sent(conn: sa.Connection, since: Any, before: Any) -> Any:
        """The sent time of the journal's first entry from ``since`` to ``before``, if any."""
        return conn.execute(
            sa.select(sa.func.min(_JOURNAL.c.sent_at)).where(
                _JOURNAL.c.sent_at >= since, _JOURNAL.c.sent_at < before
            )
        ).scalar()

    def _merge(self, conn: sa.Connection) -> Upkeep:
        """A merge one step on: the runs it replaced swept (a chunk of their blocks), else the
        next range of keys of the run being merged, else a merge begun (``_begin``)."""
        if self._sweep(conn):
            return Upkeep(more=True)
        run = conn.execute(
            sa.select(_RUNS.c.run, _RUNS.c.level).where(_RUNS.c.entries.is_(None)).limit(1)
        ).one_or_none() or self._begin(conn)
        if run is None:
            return Upkeep()
        return self._merge_range(conn, run.run, run.level)

    def _begin(self, conn: sa.Connection) -> sa.Row[Any] | None:
        """The oldest ``fanin`` runs of the lowest level that has that many, named as the
        inputs of a run of the next level, with no count yet: being merged."""
        for level in range(self.top_level):
            runs = conn.execute(
                sa.select(_RUNS.c.run, _RUNS.c.first_at, _RUNS.c.upto)
                .where(
                    _RUNS.c.level == level,
                    _RUNS.c.merged_into.is_(None),
                    _RUNS.c.entries.is_not(None),
                )
                .order_by(_RUNS.c.first_at)
                .limit(self.fanin)
            ).all()
            if len(runs) < self.fanin:
                continue
            span = {"first_at": min(r.first_at for r in runs), "upto": max(r.upto for r in runs)}
            run = conn.execute(
                sa.insert(_RUNS)
                .values(level=level + 1, entries=None, **span)
                .returning(_RUNS.c.run, _RUNS.c.level)
            ).one()
            inputs = [r.run for r in runs]
            conn.execute(
                sa.update(_RUNS).where(_RUNS.c.run.in_(inputs)).values(merged_into=run.run)
            )
            return run
        return None

    def _merge_range(self, conn: sa.Connection, run: int, level: int) -> Upkeep:
        """The inputs' entries of the next range of keys into ``run``: after the greatest
        key it holds, up to the next of ``key_bound``'s bounds (about ``merge_chunk`` of
        them); past the last, its count, and the inputs replaced. A range with no entries is
        no step: the next follows in the same transaction."""
        totals = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(_RUNS.c.entries), 0)).where(
                _RUNS.c.merged_into == run
            )
        ).scalar_one()
        chunks = max(1, -(-int(totals) // self.merge_chunk))
        greatest = sa.func.cardinality(_BLOCKS.c.message_keys)
        after: str | None = conn.execute(
            sa.select(_BLOCKS.c.message_keys[greatest])
            .where(_BLOCKS.c.run == run)
            .order_by(_BLOCKS.c.first_key.desc())
            .limit(1)
        ).scalar()
        low = _Low(after, inclusive=False) if after is not None else None
        while True:
            high = next_bound(low.key if low is not None else None, chunks)
            if self._write(conn, self._inputs(run, low, high), run) or high is None:
                break
            low = _Low(high, inclusive=True)
        if high is not None:
            return Upkeep(more=True)
        count = conn.execute(
            sa.select(sa.func.coalesce(sa.func.sum(greatest), 0)).where(_BLOCKS.c.run == run)
        ).scalar_one()
        return Upkeep((self._finished(conn, run, level, int(count)),), more=True)

    @staticmethod
    def _inputs(run: int, low: _Low | None, high: str | None) -> sa.Select[Any]:
        """The entries (``key``, ``sent_at``) of the runs being merged into ``run`` from
        ``low`` to ``high`` (exclusive; None: no bound): in each input, from the block of
        the greatest first key at most ``low`` (it may hold keys past it), through the
        index."""
        inputs = _RUNS.alias("input")
        floor: sa.ColumnElement[Any] = _key(_FIRST_KEY)
        if low is not None:
            below = (
                sa.select(_BLOCKS.c.first_key)
                .where(_BLOCKS.c.run == inputs.c.run, _BLOCKS.c.first_key <= low.key)
                .order_by(_BLOCKS.c.first_key.desc())
                .limit(1)
                .scalar_subquery()
            )
            floor = sa.func.coalesce(below, floor)
        starts = (
            sa.select(inputs.c.run, floor.label("from_key"))
            .where(inputs.c.merged_into == run)
            .subquery("starts")
        )
        within = [_BLOCKS.c.run == starts.c.run, _BLOCKS.c.first_key >= starts.c.from_key]
        entry = (
            sa.func.unnest(_BLOCKS.c.message_keys, _BLOCKS.c.sent_at)
            .table_valued("key", "sent_at")
            .render_derived("entry")
        )
        keys = []
        if high is not None:
            within.append(_BLOCKS.c.first_key < high)
            keys.append(entry.c.key < _key(high))
        if low is not None:
            at = _key(low.key)
            keys.append(entry.c.key >= at if low.inclusive else entry.c.key > at)
        return (
            sa.select(entry.c.key, entry.c.sent_at)
            .select_from(starts.join(_BLOCKS, sa.and_(*within)).join(entry, sa.true()))
            .where(*keys)
        )

    def _sweep(self, conn: sa.Connection) -> bool:
        """A chunk of the blocks of the runs a finished merge replaced, and those runs once
        they have none (a run's blocks deleted in one transaction were a merge's whole size
        again). Whether there were any."""
        target = _RUNS.alias("target")
        replaced = (
            sa.select(_RUNS.c.run)
            .join(target, target.c.run == _RUNS.c.merged_into)
            .where(target.c.entries.is_not(None))
        )
        runs = conn.execute(replaced).scalars().all()
        if not runs:
            return False
        doomed = (
            sa.select(_BLOCKS.c.run, _BLOCKS.c.first_key)
            .where(_BLOCKS.c.run.in_(runs))
            .limit(max(1, self.merge_chunk // self.block))
        )
        conn.execute(
            sa.delete(_BLOCKS).where(sa.tuple_(_BLOCKS.c.run, _BLOCKS.c.first_key).in_(doomed))
        )
        conn.execute(
            sa.delete(_RUNS).where(
                _RUNS.c.run.in_(runs), ~sa.exists().where(_BLOCKS.c.run == _RUNS.c.run)
            )
        )
        return True

    def _write(self, conn: sa.Connection, entries: sa.Select[Any], run: int) -> int:
        """``entries`` (``key``, ``sent_at``) as blocks of ``run``, in key order: of a key there
        twice, its latest entry. The entries written."""
        latest = entries.subquery("entries")
        distinct = (
            sa.select(latest.c.key, latest.c.sent_at)
            .ext(postgresql.distinct_on(latest.c.key))
            .order_by(latest.c.key, latest.c.sent_at.desc())
            .subquery("latest")
        )
        numbered = sa.select(
            distinct.c.key,
            distinct.c.sent_at,
            ((sa.func.row_number().over(order_by=distinct.c.key) - 1) // self.block).label("block"),
        ).subquery("numbered")
        keys = sa.func.array_agg(postgresql.aggregate_order_by(numbered.c.key, numbered.c.key))
        blocks: sa.Select[Any] = sa.select(
            sa.literal(run, sa.BigInteger()),
            keys[1],  # its first key (PostgreSQL 15 has no min() of uuids)
            keys,
            sa.func.array_agg(postgresql.aggregate_order_by(numbered.c.sent_at, numbered.c.key)),
        ).group_by(numbered.c.block)
        written = conn.execute(
            sa.insert(_BLOCKS)
            .from_select(["run", "first_key", "message_keys", "sent_at"], blocks)
            .returning(sa.func.cardinality(_BLOCKS.c.message_keys))
        ).scalars()
        return sum(written)

    @staticmethod
    def _finished(conn: sa.Connection, run: int, level: int, count: int) -> Made:
        conn.execute(sa.update(_RUNS).where(_RUNS.c.run == run).values(entries=count))
        log.info(
            "sent log entries sealed into a run",
            extra={"action": "sent_run", "level": level, "entries": count},
        )
        return Made(level, count)


def _key(value: str) -> sa.ColumnElement[Any]:
    """A key as a bound parameter of the keys' type (an unnested key has none of its own)."""
    return sa.literal(value, sa.Uuid(as_uuid=False))


@dataclass(frozen=True)
class _Low:
    """Where a merge's range of keys begins: after a key it wrote, or at a bound."""

    key: str
    inclusive: bool


def purge_chunk(cutoff: sa.ColumnElement[Any], chunk: int) -> Callable[[sa.Connection], int]:
    """One transaction's purge of the runs whose span ended before ``cutoff``: the blocks of
    about ``chunk`` of their entries, then the runs left with none. The entries purged. A
    lookup meanwhile counts none of their entries: the journal's own purge has gone past
    them."""
    expired = sa.select(_RUNS.c.run).where(_RUNS.c.upto < cutoff)
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
    empty = sa.delete(_RUNS).where(
        _RUNS.c.upto < cutoff, ~sa.exists().where(_BLOCKS.c.run == _RUNS.c.run)
    )

    def one_chunk(conn: sa.Connection) -> int:
        purged = sum(conn.execute(gone).scalars())
        conn.execute(empty)
        return int(purged)

    return one_chunk
