"""The console's counts: exact, or a lower bound that was counted, never the planner's
estimate (PostgreSQL keeps no statistics of a partial index's expression: its estimate of a
cause's rows was 0.5% of the table, 1,008 for 70,008), and nothing a writer pays for (no
trigger, no counter table).

Parked rows are counted by a walk, most recently parked first, a chunk of
``COUNT_CHUNK_ROWS`` at a time: each chunk's end is found in the index of parked rows by
time alone, then its rows are counted by keys (a reason's prefix, whether a row falls
within a change's bound) in one grouped statement over that range of the index. Each
statement reads at most a chunk, whatever the outbox holds; the walk stops when it has read
every parked row (every count exact) or when ``COUNT_BUDGET_S`` has passed (what it read is
counted, and it says where it stopped). Other figures are counted up to a cap, from an index.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from relay.console_records import Counted, Tally
from relay.db.dialects import of
from relay.db.schema import outbox
from relay.records import PARKED

# A parked row's ``next_attempt_at`` is when it was parked (``relay.settle``).
parked_time = outbox.c.next_attempt_at

# A page's walk over the parked rows stops after this long (seconds), between two chunks:
# the overview's walk of 300,000 parked rows took 1.2 s (median; bench.console on a 2-core
# machine shared with a test suite), so counts stay exact into the hundreds of thousands,
# and beyond them a page still answers within a few seconds, with lower bounds.
COUNT_BUDGET_S = 2.0
# Parked rows a chunk of the walk reads: one grouped statement of 20,000 rows took 40 ms on
# PostgreSQL (EXPLAIN ANALYZE), short beside the budget (the walk stops at most a chunk
# past it), long enough that each statement's round trip and planning are small.
COUNT_CHUNK_ROWS = 20_000


@dataclass(frozen=True, slots=True)
class Walked:
    """What a walk counted: each key's rows (by the keys' values, in their order); whether
    it read every parked row, and if not, the time at or before which it read none."""

    tallies: dict[tuple[Any, ...], Tally]
    exact: bool
    unread_before: datetime | None


@dataclass(frozen=True, slots=True)
class Budget:
    """How long a walk may take, and its chunks' size (tests make both small)."""

    seconds: float = COUNT_BUDGET_S
    chunk: int = COUNT_CHUNK_ROWS
    clock: Callable[[], float] = time.monotonic


def _at_or_before(at: tuple[datetime, int]) -> sa.ColumnElement[bool]:
    """Parked at or before the row ``at`` (its parking time and id), in the walk's order.
    The time's bound comes first alone: a range of the index on every database (an OR of
    the two, alone, made PostgreSQL read each chunk's index from its start)."""
    parked_at, row_id = at
    return sa.and_(parked_time <= parked_at, sa.or_(parked_time < parked_at, outbox.c.id <= row_id))


def parked_after(at: tuple[datetime, int]) -> sa.ColumnElement[bool]:
    """Parked after the row ``at``, in the walk's order (as ``_at_or_before``)."""
    parked_at, row_id = at
    return sa.and_(parked_time >= parked_at, sa.or_(parked_time > parked_at, outbox.c.id > row_id))


def _merged(was: Tally | None, rows: int, first: datetime, last: datetime) -> Tally:
    """A key's tally with a chunk's rows of it added."""
    if was is None or was.first is None or was.last is None:
        return Tally(rows, first, last)
    return Tally(was.rows + rows, min(first, was.first), max(last, was.last))


def walk(
    conn: sa.Connection,
    keys: Sequence[sa.ColumnElement[Any]],
    where: list[sa.ColumnElement[bool]],
    budget: Budget,
) -> Walked:
    """The parked rows ``where`` selects, counted by ``keys`` within ``budget``."""
    deadline = budget.clock() + budget.seconds
    parked = outbox.c.status == PARKED
    labelled = [key.label(f"key{i}") for i, key in enumerate(keys)]
    # By position: a key with bound values (a change's bound) is one expression, not two
    # that the database would have to find equal.
    positions: list[sa.ColumnElement[Any]] = [
        sa.literal_column(str(i + 1)) for i in range(len(keys))
    ]
    tallies: dict[tuple[Any, ...], Tally] = {}
    start: tuple[datetime, int] | None = None  # the newest row not yet read
    while True:
        read_from = [] if start is None else [_at_or_before(start)]
        # The first row past this chunk, from the index of parked rows by time alone.
        found = conn.execute(
            sa.select(parked_time, outbox.c.id)
            .where(parked, *read_from)
            .order_by(parked_time.desc(), outbox.c.id.desc())
            .limit(1)
            .offset(budget.chunk)
        ).first()
        past = None if found is None else (found[0], int(found[1]))
        read_to = [] if past is None else [parked_after(past)]
        counted = (
            sa.select(
                *labelled, sa.func.count(), sa.func.min(parked_time), sa.func.max(parked_time)
            )
            .where(parked, *where, *read_from, *read_to)
            .group_by(*positions)
        )
        for *values, rows, first, last in conn.execute(counted):
            value = tuple(values)
            tallies[value] = _merged(tallies.get(value), int(rows), first, last)
        if past is None:
            return Walked(tallies, exact=True, unread_before=None)
        start = past
        if budget.clock() >= deadline:
            return Walked(tallies, exact=False, unread_before=past[0])


def every_cause(conn: sa.Connection, most: int) -> tuple[list[str | None], bool]:
    """The distinct causes of the parked rows, in order, read from the console's index of
    causes one step down it per cause (a loose index scan: the walk's cost is the causes',
    not the rows'), at most ``most``, and None last if rows have none yet (the oldest, the
    walk's last to reach: their line went when it stopped short, an outside review); and
    whether that was every one. Where the database has no such index (MySQL: no partial
    indexes), none, and not every one: its causes are the walk's."""
    if not of(conn).partial_indexes:
        return [], False
    parked = outbox.c.status == PARKED

    def first_after(*after: sa.ColumnElement[bool]) -> sa.ScalarSelect[Any]:
        return (
            sa.select(outbox.c.cause)
            .where(parked, outbox.c.cause.is_not(None), *after)
            .order_by(outbox.c.cause)
            .limit(1)
            .scalar_subquery()
        )

    found = sa.select(first_after().label("cause")).cte("found", recursive=True)
    found = found.union_all(
        sa.select(first_after(outbox.c.cause > found.c.cause)).where(found.c.cause.is_not(None))
    )
    causes: list[str | None] = list(
        conn.execute(
            sa.select(found.c.cause).where(found.c.cause.is_not(None)).limit(most + 1)
        ).scalars()
    )
    every = len(causes) <= most
    causes = causes[:most]
    if conn.execute(sa.select(sa.exists().where(parked, outbox.c.cause.is_(None)))).scalar():
        causes.append(None)
    return causes, every


def capped(conn: sa.Connection, rows: sa.Select[Any], cap: int) -> Counted:
    """How many rows ``rows`` selects, counted up to ``cap`` (an index's walk that stops
    there): exact, or more than ``cap``."""
    bounded = sa.select(sa.func.count()).select_from(rows.limit(cap + 1).subquery())
    found = int(conn.execute(bounded).scalar_one())
    return Counted(found) if found <= cap else Counted(cap, exact=False, more=True)
