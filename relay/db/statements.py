"""Statements every role shares, written once for every database (``relay.db.dialects``
builds the pieces that differ): deletes in chunks, counts bounded by the planner, and what a
replay writes."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from relay.db.clock import database_time
from relay.db.dialects import of
from relay.db.engine import transaction
from relay.records import PENDING


def in_chunks(
    engine: sa.Engine,
    one_chunk: Callable[[sa.Connection], int],
    *,
    chunk: int,
    what: str,
    where: str,
    stop: threading.Event | None = None,
    progress: Callable[[int], None] | None = None,
) -> int:
    """``one_chunk`` (which deletes at most ``chunk`` rows, and says how many) in a
    transaction of its own, again and again until it deletes fewer; returns how many in all.
    ``progress`` is told the total after each full chunk; a set ``stop`` ends it after the
    chunk under way."""
    deleted = 0
    while stop is None or not stop.is_set():
        with transaction(engine, what, where) as conn:
            count = one_chunk(conn)
        deleted += count
        if count < chunk:
            break
        if progress is not None:
            progress(deleted)
    return deleted


def run_delete(delete: sa.Delete, conn: sa.Connection) -> int:
    """``delete`` on ``conn``; the rows it deleted (a chunk for ``in_chunks``)."""
    return int(conn.execute(delete).rowcount)


def bounded_count(conn: sa.Connection, rows: sa.Select[Any], exact_upto: int) -> int:
    """How many rows ``rows`` selects: counted up to ``exact_upto`` (a count stops there),
    estimated beyond by the database's planner (never below the count; SQLite has no
    estimate). ``count(*)`` of a 1M-row backlog took 279 ms; this takes a few ms at any size."""
    bounded = sa.select(sa.func.count()).select_from(rows.limit(exact_upto + 1).subquery())
    count = int(conn.execute(bounded).scalar_one())
    if count > exact_upto and (estimate := of(conn).planner_estimate(conn, rows)) is not None:
        count = max(count, estimate)
    return count


def replayed() -> dict[str, Any]:
    """What a replay writes to a row, ``relay replay``'s and the console's alike: pending
    again, due now, its attempts reset, its suspicion and sent time gone, and its cause:
    parked again by a relay of the release before (which writes none), it is sorted afresh,
    not left under the cause it had (an outside review)."""
    return {
        "status": PENDING,
        "attempts": 0,
        "next_attempt_at": database_time(),
        "sent_at": None,
        "suspect": False,
        "cause": None,
    }
