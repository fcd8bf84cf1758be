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

Sealing and merging take one relay at a time (a transaction-scoped advisory lock): every
``SENT_RUN_SEAL_S`` the journal's entries sent up to ``SENT_RUN_MARGIN_S`` ago (every ack
that sent them has committed or failed by then: its statements are bounded) become a run of
level 0; ``SENT_RUN_FANIN`` runs of one level become one of the next, up to
``SENT_RUN_TOP_LEVEL``, so that a week's log is a few dozen runs and each entry is written
about three times more, a few dozen bytes each. A run's entries keep their sent times: a
lookup counts only those the journal still holds (sent at or after its oldest row), so that
a run whose span straddles the horizon remembers nothing the purge forgot.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from relay.constants import (
    SENT_RUN_BLOCK,
    SENT_RUN_FANIN,
    SENT_RUN_MARGIN_S,
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
# The advisory lock sealers and mergers take (any constant other tools are unlikely to use).
_LOCK = 0x6F75_7462_7275_6E73  # "outbruns"


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


class SentRuns:
    """The runs' upkeep (``maintain``), in the relay's bounded sessions but for the runs'
    own statements. Nothing where the log is not journaled (it has no runs)."""

    def __init__(
        self,
        url: str,
        *,
        seal_s: float = SENT_RUN_SEAL_S,
        margin_s: float = SENT_RUN_MARGIN_S,
        fanin: int = SENT_RUN_FANIN,
        top_level: int = SENT_RUN_TOP_LEVEL,
        block: int = SENT_RUN_BLOCK,
    ) -> None:
        self.engine = create_engine(url, relay_session=True)
        self._where = redact_url(url)
        self._journaled = of(self.engine).journals_sent_log
        self.seal_s, self.margin_s, self.fanin, self.top_level = seal_s, margin_s, fanin, top_level
        self.block = block

    def maintain(self) -> list[Made]:
        """Seal the journal's tail if a span is due, then merge each level that has enough
        runs: each in a transaction of its own, none while another relay holds the lock."""
        made: list[Made] = []
        if not self._journaled:
            return made
        with db_errors("sent log runs", self._where):
            sealed = self._locked(self._seal)
            if sealed is not None:
                made.append(sealed)
            for level in range(self.top_level):
                merged = self._locked(functools.partial(self._merge, level=level))
                if merged is not None:
                    made.append(merged)
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

    def _locked(self, work: Callable[[sa.Connection], Made | None]) -> Made | None:
        with self.engine.begin() as conn:
            if not conn.execute(sa.select(sa.func.pg_try_advisory_xact_lock(_LOCK))).scalar():
                return None
            # A run of a busy week is sorted in one statement: as long as it takes, in the
            # rebuild's memory, and ended with its relay (``Dialect.unbounded``).
            of(conn).unbounded(conn)
            made: Made | None = work(conn)
            return made

    def _seal(self, conn: sa.Connection) -> Made | None:
        """The journal's entries sent from the tail's start to ``margin_s`` ago as a run, once
        that span is ``seal_s`` long: of level 0, or of the level whose runs span as long."""
        start = _tail_start()
        first_at, upto, due = conn.execute(
            sa.select(
                start.label("first_at"),
                database_time(-self.margin_s).label("upto"),
                (start <= database_time(-self.margin_s - self.seal_s)).label("due"),
            )
        ).one()
        if first_at is None or not due:
            return None
        entry = unnested(_JOURNAL, ("key",))
        entries = (
            sa.select(entry.c.key, _JOURNAL.c.sent_at)
            .select_from(_JOURNAL.join(entry, sa.true()))
            .where(_JOURNAL.c.sent_at >= first_at, _JOURNAL.c.sent_at < upto)
        )
        # A span as long as a merged run's (the first seal of a journal days old, or after
        # the relays were away) is sealed as one of that level at once.
        level, span = 0, (upto - first_at).total_seconds()
        while level < self.top_level and span >= self.seal_s * self.fanin ** (level + 1):
            level += 1
        return self._write(conn, entries, level, (first_at, upto), [])

    def _merge(self, conn: sa.Connection, *, level: int) -> Made | None:
        """The oldest ``fanin`` runs of ``level``, if it has that many, as one of the next."""
        runs = conn.execute(
            sa.select(_RUNS.c.run, _RUNS.c.first_at, _RUNS.c.upto)
            .where(_RUNS.c.level == level)
            .order_by(_RUNS.c.first_at)
            .limit(self.fanin)
        ).all()
        if len(runs) < self.fanin:
            return None
        merged = [r.run for r in runs]
        entry = (
            sa.func.unnest(_BLOCKS.c.message_keys, _BLOCKS.c.sent_at)
            .table_valued("key", "sent_at")
            .render_derived("entry")
        )
        entries = (
            sa.select(entry.c.key, entry.c.sent_at)
            .select_from(_BLOCKS.join(entry, sa.true()))
            .where(_BLOCKS.c.run.in_(merged))
        )
        first_at, upto = min(r.first_at for r in runs), max(r.upto for r in runs)
        return self._write(conn, entries, level + 1, (first_at, upto), merged)

    def _write(
        self,
        conn: sa.Connection,
        entries: sa.Select[Any],
        level: int,
        span: tuple[Any, Any],
        replaced: Sequence[int],
    ) -> Made:
        """``entries`` (``key``, ``sent_at``) as a new run of ``level`` spanning ``span``
        (its first sent time and the end, exclusive), replacing the runs ``replaced``: of a
        key there twice, its latest entry."""
        first_at, upto = span
        run = conn.execute(
            sa.select(sa.func.coalesce(sa.func.max(_RUNS.c.run), 0) + 1)
        ).scalar_one()
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
        count = sum(written)
        conn.execute(
            sa.insert(_RUNS).values(
                run=run, level=level, first_at=first_at, upto=upto, entries=count
            )
        )
        if replaced:
            conn.execute(sa.delete(_BLOCKS).where(_BLOCKS.c.run.in_(replaced)))
            conn.execute(sa.delete(_RUNS).where(_RUNS.c.run.in_(replaced)))
        log.info(
            "sent log entries sealed into a run",
            extra={"action": "sent_run", "level": level, "entries": count, "runs": len(replaced)},
        )
        return Made(level, count)


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
