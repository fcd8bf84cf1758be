"""A merge of the sent log's runs (``relay.db.sentruns``): ``fanin`` runs of a level into one
of the next, a range of keys a transaction, so that a merge of the top level (61 million
entries at 2,000 acks a second) neither holds back the database's vacuum for its length
nor sorts it at once. Its state is in its rows: the run it writes is ``building``, and its
inputs name it (``merged_into``), so that whichever relay takes the merge's lock next goes
on with it, after the greatest key written. Lookups read the inputs (and the
part written) until it is done; the inputs are then swept, a chunk of blocks at a time.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from relay.db.schema import outbox_sent_blocks, outbox_sent_runs
from relay.db.sentblocks import Upkeep, finished, write_blocks

_RUNS = outbox_sent_runs
_BLOCKS = outbox_sent_blocks
# The least key: where the first range of a merge's input begins.
_FIRST_KEY = str(uuid.UUID(int=0))


def key_bound(index: int, chunks: int) -> str:
    """The first key of the ``index``-th of ``chunks`` equal ranges of keys (uuids; a key is
    a message id's MD5, so that equal ranges hold about as many keys each)."""
    return str(uuid.UUID(int=(index << 128) // chunks))


def next_bound(after: str | None, chunks: int) -> str | None:
    """The end of the range of keys a merge writes after the key ``after`` (None: from the
    first key): the first bound of ``chunks`` ranges past it, or None past the last. The
    least ``j`` with ``key_bound(j) > after``, ``ceil((after + 1) * chunks / 2**128)``: a
    bound rounded down is no key's index times the range (an outside review: for a count
    not a power of two, the bound after a bound was itself, and a merge looped on it)."""
    above = 1 if after is None else -((-(uuid.UUID(after).int + 1) * chunks) >> 128)
    return key_bound(above, chunks) if above < chunks else None


class Merge:
    """A merge's steps (``step``), each in the caller's transaction under its lock."""

    def __init__(self, *, fanin: int, top_level: int, block: int, chunk: int) -> None:
        self.fanin, self.top_level, self.block, self.merge_chunk = fanin, top_level, block, chunk

    def step(self, conn: sa.Connection) -> Upkeep:
        """A merge one step on: the runs it replaced swept (a chunk of their blocks), else the
        next range of keys of the run being merged, else a merge begun (``_begin``)."""
        if self._sweep(conn):
            return Upkeep(more=True)
        run = conn.execute(
            sa.select(_RUNS.c.run, _RUNS.c.level).where(_RUNS.c.building).limit(1)
        ).one_or_none() or self._begin(conn)
        if run is None:
            return Upkeep()
        return self._merge_range(conn, run.run, run.level)

    def _begin(self, conn: sa.Connection) -> sa.Row[Any] | None:
        """The oldest ``fanin`` runs of the lowest level that has that many, named as the
        inputs of a run of the next level, ``building``: being merged."""
        for level in range(self.top_level):
            runs = conn.execute(
                sa.select(_RUNS.c.run, _RUNS.c.first_at, _RUNS.c.upto)
                .where(
                    _RUNS.c.level == level,
                    _RUNS.c.merged_into.is_(None),
                    ~_RUNS.c.building,
                )
                .order_by(_RUNS.c.first_at)
                .limit(self.fanin)
            ).all()
            if len(runs) < self.fanin:
                continue
            span = {"first_at": min(r.first_at for r in runs), "upto": max(r.upto for r in runs)}
            run = conn.execute(
                sa.insert(_RUNS)
                .values(level=level + 1, entries=0, building=True, **span)
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
        them), counted into its entries as they are written; past the last, the run done and
        its inputs replaced. A range with no entries is no step: the next follows in the
        same transaction."""
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
            written = write_blocks(conn, self._inputs(run, low, high), run, self.block)
            if written or high is None:
                break
            low = _Low(high, inclusive=True)
        count = conn.execute(
            sa.update(_RUNS)
            .where(_RUNS.c.run == run)
            .values(entries=_RUNS.c.entries + written)
            .returning(_RUNS.c.entries)
        ).scalar_one()
        if high is not None:
            return Upkeep(more=True)
        return Upkeep((finished(conn, run, level, int(count)),), more=True)

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
            .where(~target.c.building)
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


def _key(value: str) -> sa.ColumnElement[Any]:
    """A key as a bound parameter of the keys' type (an unnested key has none of its own)."""
    return sa.literal(value, sa.Uuid(as_uuid=False))


@dataclass(frozen=True)
class _Low:
    """Where a merge's range of keys begins: after a key it wrote, or at a bound."""

    key: str
    inclusive: bool
