"""The console's archive of discarded rows, by filter (``ArchiveFilter``): a page of it, its
count, and which rows a restore by filter takes, a chunk at a time, and which it leaves
because they were archived after the page was drawn. A bulk discard is undone whole by its
done page's link: the rows it archived, by its actor and its time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from relay.console_constants import CONSOLE_CHUNK_ROWS, CONSOLE_NAMED_IDS
from relay.console_records import ArchiveFilter, Counted, LeftAfter, RowSummary
from relay.constants import BACKLOG_EXACT_ROWS
from relay.db.clock import database_time
from relay.db.console_counts import capped
from relay.db.console_rows import ARCHIVED_SUMMARY, cut_texts, summary
from relay.db.dialects import of
from relay.db.engine import transaction
from relay.db.schema import WRITTEN_COLUMNS, outbox, outbox_archive
from relay.records import PARKED

_A = outbox_archive.c
# What the archive keeps of a discarded row, as the outbox held it.
ARCHIVED_COLUMNS = ("id", *WRITTEN_COLUMNS, "created_at", "attempts", "last_error")
# A row whose message id the outbox holds again (written anew meanwhile) stays archived.
_FREE = ~sa.exists().where(outbox.c.message_id == _A.message_id)


def archive_where(chosen: ArchiveFilter) -> list[sa.ColumnElement[bool]]:
    """The conditions of ``chosen`` on the archive, every value bound (a filter may hold
    any text)."""
    where: list[sa.ColumnElement[bool]] = []
    if chosen.discarded_by:
        where.append(_A.archived_by == chosen.discarded_by)
    if chosen.exchange:
        where.append(_A.exchange == chosen.exchange)
    if chosen.reason:
        where.append(_A.last_error.contains(chosen.reason, autoescape=True))
    if chosen.since is not None:
        where.append(_A.archived_at >= chosen.since)
    if chosen.until is not None:
        where.append(_A.archived_at <= chosen.until)
    return where


def listed(
    conn: sa.Connection, chosen: ArchiveFilter, after: int | None, limit: int
) -> list[RowSummary]:
    """Discarded rows ``chosen`` selects, the last discarded first, after the id ``after``."""
    statement = sa.select(*cut_texts(ARCHIVED_SUMMARY)).where(*archive_where(chosen))
    if after is not None:
        statement = statement.where(_A.id < after)
    statement = statement.order_by(_A.id.desc()).limit(limit)
    return [summary(r) for r in conn.execute(statement)]


def counted(conn: sa.Connection, chosen: ArchiveFilter, bound: Any) -> tuple[Counted, LeftAfter]:
    """How many discarded rows ``chosen`` selects that were archived by ``bound`` (what a
    restore by filter takes: exact up to ``BACKLOG_EXACT_ROWS``, else more than that), and
    those archived after it (what it leaves: few, the first named)."""
    where = archive_where(chosen)
    within = capped(
        conn, sa.select(_A.id).where(*where, _A.archived_at <= bound), BACKLOG_EXACT_ROWS
    )
    return within, _since(conn, where, bound)


def archived_since(engine: sa.Engine, where: str, chosen: ArchiveFilter, bound: Any) -> LeftAfter:
    """The discarded rows ``chosen`` selects that were archived after ``bound``."""
    with transaction(engine, "console count", where) as conn:
        return _since(conn, archive_where(chosen), bound)


def _since(conn: sa.Connection, where: list[sa.ColumnElement[bool]], bound: Any) -> LeftAfter:
    after = [*where, _A.archived_at > bound]
    rows = int(conn.execute(sa.select(sa.func.count()).where(*after)).scalar_one())
    if not rows:
        return LeftAfter(0, ())
    first = sa.select(_A.id).where(*after).order_by(_A.id).limit(CONSOLE_NAMED_IDS)
    return LeftAfter(rows, tuple(int(i) for i in conn.scalars(first)))


def archived_matching(
    engine: sa.Engine, where: str, chosen: ArchiveFilter, bound: Any
) -> Iterator[list[int]]:
    """The ids of the discarded rows ``chosen`` selects that were archived by ``bound``, a
    chunk at a time, each read after the one before was restored (keyset on the id: no row
    read twice, none missed, whether its chunk moved it or left it)."""
    last = None
    while True:
        conditions = [*archive_where(chosen), _A.archived_at <= bound]
        if last is not None:
            conditions.append(_A.id > last)
        statement = sa.select(_A.id).where(*conditions).order_by(_A.id).limit(CONSOLE_CHUNK_ROWS)
        with transaction(engine, "console select", where) as conn:
            ids = [int(i) for i in conn.scalars(statement)]
        if not ids:
            return
        yield ids
        last = ids[-1]


def restored(conn: sa.Connection, batch: list[int]) -> list[int]:
    """A restore's chunk: of the archived rows ``batch`` names, those whose message id the
    outbox does not hold again, back into the outbox as they were, parked (from now), each
    with its id; the ids it moved."""
    movable = [
        int(i)
        for i in conn.scalars(
            sa.select(_A.id).where(of(conn).id_in(_A.id), _FREE).with_for_update(),
            {"ids": batch},
        )
    ]
    if not movable:
        return []
    rows = sa.select(
        *[_A[name] for name in ARCHIVED_COLUMNS],
        sa.literal(PARKED).label("status"),
        database_time().label("next_attempt_at"),
    ).where(of(conn).id_in(_A.id))
    conn.execute(
        sa.insert(outbox).from_select([*ARCHIVED_COLUMNS, "status", "next_attempt_at"], rows),
        {"ids": movable},
    )
    conn.execute(sa.delete(outbox_archive).where(of(conn).id_in(_A.id)), {"ids": movable})
    return movable


def archived(conn: sa.Connection, ids: list[int], by: str) -> None:
    """The outbox's rows ``ids`` moved whole into the archive, discarded by ``by`` now (the
    time given, not the column's default: SQLite's is in whole seconds, and the archive's
    filter and bound compare it with times in microseconds)."""
    o = outbox.c
    rows = sa.select(
        *[o[name] for name in ARCHIVED_COLUMNS],
        sa.literal(by).label("archived_by"),
        database_time().label("archived_at"),
    ).where(of(conn).id_in(o.id))
    into = [*ARCHIVED_COLUMNS, "archived_by", "archived_at"]
    conn.execute(sa.insert(outbox_archive).from_select(into, rows), {"ids": ids})
    conn.execute(sa.delete(outbox).where(of(conn).id_in(o.id)), {"ids": ids})
