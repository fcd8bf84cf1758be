"""The operator console's reads of single rows and of its own tables: a row's page (from the
outbox or the archive, its payload cut to a preview, its edited copies, the rows of its key
held behind it), the archive's list and the audit log (``relay.db.console`` has the rest)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from relay.console_constants import CONSOLE_HELD_ROWS, CONSOLE_LISTED_CHARS
from relay.console_records import AuditEntry, AuditFilter, Counted, RowDetail, RowSummary
from relay.constants import BACKLOG_EXACT_ROWS
from relay.db.console_counts import capped, parked_time
from relay.db.decode import readable_text
from relay.db.dialects import of
from relay.db.schema import console_audit, outbox, outbox_archive, outbox_edits
from relay.records import PARKED, PENDING

# The texts a list cuts (``cut_texts``).
_TEXTS = frozenset({"message_id", "exchange", "routing_key", "ordering_key", "last_error"})
SUMMARY_COLUMNS = (
    outbox.c.id,
    outbox.c.message_id,
    outbox.c.exchange,
    outbox.c.routing_key,
    outbox.c.ordering_key,
    outbox.c.attempts,
    outbox.c.last_error,
    parked_time.label("parked_at"),
    outbox.c.created_at,
)


def cut_texts(columns: tuple[Any, ...]) -> list[Any]:
    """``columns`` as a list of rows reads them: each text cut to its first
    ``CONSOLE_LISTED_CHARS`` characters (fifty rows of 2 MB errors made a page of 105 MB, which
    a browser took 104 s to draw); a row's own page shows them whole."""
    return [
        sa.func.substr(c, 1, CONSOLE_LISTED_CHARS).label(c.key) if c.key in _TEXTS else c
        for c in columns
    ]


def summary(row: Any) -> RowSummary:
    """A row as the lists show it: text that was not UTF-8 (SQLite keeps any bytes) shown
    with U+FFFD."""
    return RowSummary(
        id=int(row.id),
        message_id=readable_text(row.message_id),
        exchange=readable_text(row.exchange),
        routing_key=readable_text(row.routing_key),
        ordering_key=None if row.ordering_key is None else readable_text(row.ordering_key),
        attempts=int(row.attempts),
        last_error=readable_text(row.last_error or ""),
        parked_at=row.parked_at,
        created_at=row.created_at,
    )


ARCHIVED_SUMMARY = (
    outbox_archive.c.id,
    outbox_archive.c.message_id,
    outbox_archive.c.exchange,
    outbox_archive.c.routing_key,
    outbox_archive.c.ordering_key,
    outbox_archive.c.attempts,
    outbox_archive.c.last_error,
    outbox_archive.c.archived_at.label("parked_at"),
    outbox_archive.c.created_at,
)


def row_detail(conn: sa.Connection, row_id: int, preview: int) -> RowDetail | None:
    """A row of the outbox (any status) or of the archive, its payload cut to ``preview``
    bytes, its links to edited copies, and with ordering on (an ordering key), its key's
    pending rows held behind it."""
    found = _row(conn, outbox, SUMMARY_COLUMNS, row_id, preview) or _row(
        conn, outbox_archive, ARCHIVED_SUMMARY, row_id, preview
    )
    if found is None:
        return None
    detail, ordering_key = found
    edited_from = conn.execute(
        sa.select(outbox_edits.c.original_id).where(outbox_edits.c.copy_id == row_id)
    ).scalar_one_or_none()
    edited_into = conn.scalars(
        sa.select(outbox_edits.c.copy_id)
        .where(outbox_edits.c.original_id == row_id)
        .order_by(outbox_edits.c.copy_id)
    )
    held: list[RowSummary] = []
    held_more = Counted(0)
    if ordering_key is not None and detail.status == PARKED:
        behind = (
            outbox.c.status == PENDING,
            outbox.c.ordering_key == ordering_key,
            outbox.c.id > row_id,
        )
        first = sa.select(*cut_texts(SUMMARY_COLUMNS)).where(*behind).order_by(outbox.c.id)
        held = [summary(r) for r in conn.execute(first.limit(CONSOLE_HELD_ROWS))]
        if len(held) == CONSOLE_HELD_ROWS:
            ids = sa.select(outbox.c.id).where(*behind, outbox.c.id > held[-1].id)
            held_more = capped(conn, ids, BACKLOG_EXACT_ROWS)
    return RowDetail(
        summary=detail.summary,
        status=detail.status,
        content_type=detail.content_type,
        headers=detail.headers,
        payload=detail.payload,
        payload_size=detail.payload_size,
        held=held,
        held_more=held_more,
        edited_from=None if edited_from is None else int(edited_from),
        edited_into=[int(i) for i in edited_into],
    )


def _row(
    conn: sa.Connection,
    table: sa.Table,
    columns: tuple[sa.ColumnElement[Any], ...],
    row_id: int,
    preview: int,
) -> tuple[RowDetail, str | None] | None:
    """The row of ``table`` (the outbox: its status; the archive: "discarded")."""
    status = table.c.status if "status" in table.c else sa.literal("discarded")
    statement = sa.select(
        *columns,
        status.label("status"),
        table.c.content_type,
        table.c.headers,
        sa.func.substr(table.c.payload, 1, preview).label("preview"),
        of(conn).stored_length(table.c.payload).label("size"),
    ).where(table.c.id == row_id)
    row = conn.execute(statement).one_or_none()
    if row is None:
        return None
    detail = RowDetail(
        summary=summary(row),
        status=row.status,
        content_type=readable_text(row.content_type),
        headers=None if row.headers is None else readable_text(row.headers),
        payload=bytes(row.preview) if row.preview is not None else b"",
        payload_size=int(row.size or 0),
    )
    return detail, row.ordering_key if table is outbox else None


def payload(conn: sa.Connection, row_id: int) -> tuple[str, bytes] | None:
    """A row's content type and whole payload, from the outbox or the archive (a download:
    its bytes as they are, never a preview)."""
    for table in (outbox, outbox_archive):
        found = conn.execute(
            sa.select(table.c.content_type, table.c.payload).where(table.c.id == row_id)
        ).one_or_none()
        if found is not None:
            return readable_text(found.content_type), bytes(found.payload)
    return None


def audit(
    conn: sa.Connection, chosen: AuditFilter, after: int | None, limit: int
) -> list[AuditEntry]:
    """The audit entries ``chosen`` selects, the newest first, after the id ``after``
    (keyset: a page's cost does not grow with its depth, by the primary key). The log holds
    a line per change or refused attempt, people's work: a filter walks it newest first,
    without an index of its own."""
    c = console_audit.c
    statement = sa.select(console_audit)
    if chosen.actor:
        statement = statement.where(
            sa.or_(c.actor == chosen.actor, c.actor.endswith(f" ({chosen.actor})", autoescape=True))
        )
    if chosen.action:
        statement = statement.where(c.action == chosen.action)
    if chosen.since is not None:
        statement = statement.where(c.at >= chosen.since)
    if chosen.until is not None:
        statement = statement.where(c.at <= chosen.until)
    if after is not None:
        statement = statement.where(c.id < after)
    statement = statement.order_by(c.id.desc()).limit(limit)
    return [
        AuditEntry(
            int(r.id),
            r.at,
            readable_text(r.actor),
            r.role,
            r.action,
            readable_text(r.target),
            int(r.rows),
            readable_text(r.result),
        )
        for r in conn.execute(statement)
    ]
