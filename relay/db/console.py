"""The operator console's reads (``relay.console``): the overview, parked rows by cause, a
page of them, one row, the archive and the audit log.

A page is an index walk bounded by the page: parked rows are read through the partial
indexes of migration 0014, most recently parked first (a parked row's ``next_attempt_at`` is
when it was parked). Counts are exact or a lower bound counted within a budget, never an
estimate (``relay.db.console_counts``). Times are the database's: ``Overview.drawn_at`` is
the bound a page's actions are pinned to.
"""

from __future__ import annotations

import sys
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from relay.buckets import fence
from relay.causes import CAUSES_LISTED, UNSORTED, grouped
from relay.console_constants import CONSOLE_CAUSES_FOUND, CONSOLE_SETTLE_HORIZON_S
from relay.console_records import (
    ArchiveFilter,
    AuditEntry,
    AuditFilter,
    Causes,
    Counted,
    Cursor,
    LeftAfter,
    Overview,
    ParkedFilter,
    RelayPresence,
    RowDetail,
    RowSummary,
)
from relay.constants import BACKLOG_EXACT_ROWS, PROTOCOL_BEFORE_FENCES
from relay.db import console_archive, console_rows
from relay.db.clock import database_time
from relay.db.columns import starts_with
from relay.db.console_counts import Budget, capped, every_cause, parked_time, walk
from relay.db.console_rows import SUMMARY_COLUMNS, cut_texts, summary
from relay.db.decode import readable_text
from relay.db.dialects import of
from relay.db.due import due_now, oldest_due_age
from relay.db.engine import create_engine, db_errors
from relay.db.schema import (
    console_sessions_ended,
    exchange_key,
    outbox,
    outbox_archive,
    outbox_buckets,
    outbox_protocol,
    outbox_relays,
)
from relay.db.sentlog import entries
from relay.records import PARKED, PENDING
from relay.redact import redact_url


def parked_where(chosen: ParkedFilter) -> list[sa.ColumnElement[bool]]:
    """The conditions of ``chosen`` on the outbox's parked rows, every value bound (never
    spliced into the SQL: a filter may hold any text). A cause is a range of the index of
    causes (the rows not sorted yet, its NULLs)."""
    where: list[sa.ColumnElement[bool]] = [outbox.c.status == PARKED]
    if chosen.cause == UNSORTED:
        where.append(outbox.c.cause.is_(None))
    elif chosen.cause:
        where.append(outbox.c.cause == chosen.cause)
    if chosen.reason:
        where.append(outbox.c.last_error.contains(chosen.reason, autoescape=True))
    if chosen.exchange:
        # The index's key too, so that the planner reads its range (migration 0017).
        where.append(exchange_key(outbox.c.exchange) == exchange_key(sa.literal(chosen.exchange)))
    for column, value in (
        (outbox.c.exchange, chosen.exchange),
        (outbox.c.routing_key, chosen.routing_key),
        (outbox.c.ordering_key, chosen.ordering_key),
        (outbox.c.message_id, chosen.message_id),
    ):
        if value:
            where.append(column == value)
    if chosen.message_prefix:
        # One range of the index of parked rows by message id (migration 0016).
        end = prefix_end(chosen.message_prefix)
        bounds = (chosen.message_prefix, *([] if end is None else [end]))
        where.append(starts_with(outbox.c.message_id, *bounds))
    if chosen.parked_before is not None:
        where.append(parked_time <= chosen.parked_before)
    return where


def prefix_end(prefix: str) -> str | None:
    """The first text, in code point order, after every text that starts with ``prefix``:
    its last character the next one (surrogates are no characters), a last U+10FFFF dropped
    first; None when there is none (every text from ``prefix`` on starts with it)."""
    kept = prefix.rstrip(chr(sys.maxunicode))
    if not kept:
        return None
    following = ord(kept[-1]) + 1
    if 0xD800 <= following <= 0xDFFF:
        following = 0xE000
    return kept[:-1] + chr(following)


def settled(bound: datetime) -> datetime:
    """The latest parking time a change by filter takes, of a page drawn at ``bound``: a row
    parked after it may have been committed after the page was drawn
    (``CONSOLE_SETTLE_HORIZON_S``)."""
    return bound - timedelta(seconds=CONSOLE_SETTLE_HORIZON_S)


class ConsoleReads:
    """What the console shows of one outbox database."""

    def __init__(self, url: str, budget: Budget | None = None) -> None:
        self.engine = create_engine(url)
        of(self.engine).short_reads(self.engine)
        self.where = redact_url(url)
        self.budget = budget or Budget()

    def now(self) -> Any:
        with db_errors("console", self.where), self.engine.connect() as conn:
            return conn.execute(sa.select(database_time())).scalar_one()

    def overview(self, listed: int = CAUSES_LISTED) -> Overview:
        """The figures, each exact or a lower bound (pending, due, sent in the last minute
        and archived rows up to ``BACKLOG_EXACT_ROWS``, from their indexes), and the parked
        rows by cause (``listed`` of them, the rest on one line)."""
        pending = sa.select(outbox.c.id).where(outbox.c.status == PENDING)
        due = sa.select(outbox.c.id).where(due_now())
        archived = sa.select(outbox_archive.c.id)
        logged = entries(of(self.engine).journals_sent_log)
        recent = sa.select(logged.c.key).where(logged.c.sent_at > database_time(-60))
        with db_errors("console overview", self.where), self.engine.connect() as conn:
            drawn_at = conn.execute(sa.select(database_time())).scalar_one()
            return Overview(
                database=self.where,
                pending=capped(conn, pending, BACKLOG_EXACT_ROWS),
                due=capped(conn, due, BACKLOG_EXACT_ROWS),
                oldest_due_age=oldest_due_age(conn),
                sent_last_minute=capped(conn, recent, BACKLOG_EXACT_ROWS),
                causes=self._causes(conn, listed),
                relays=self._relays(conn),
                least_protocol=int(
                    conn.execute(
                        sa.select(sa.func.max(outbox_protocol.c.least_protocol))
                    ).scalar_one_or_none()
                    or PROTOCOL_BEFORE_FENCES
                ),
                archived=capped(conn, archived, BACKLOG_EXACT_ROWS),
                drawn_at=drawn_at,
            )

    def cause_names(self) -> tuple[list[str], bool]:
        """The causes a rows page offers to filter by, in order, and whether that is every
        one: from the index of causes, a step down it per cause (no walk of the rows: the
        walk took 2 s a page at a million parked rows), at most ``CAUSES_LISTED``; where
        the database has none (MySQL), the walk's most frequent."""
        with db_errors("console causes", self.where), self.engine.connect() as conn:
            if not of(conn).partial_indexes:
                causes = self._causes(conn, CAUSES_LISTED)
                return [g.cause for g in causes.listed], not causes.other_causes.rows
            found, found_all = every_cause(conn, CAUSES_LISTED)
        return [UNSORTED if c is None else c for c in found], found_all

    def _causes(self, conn: sa.Connection, listed: int) -> Causes:
        """Parked rows by cause: counted by one walk (``relay.db.console_counts``), and
        every cause listed, those the walk did not reach too (from the index of causes, up
        to ``CONSOLE_CAUSES_FOUND``)."""
        walked = walk(conn, [outbox.c.cause], [], self.budget)
        tallies = {cause: tally for (cause,), tally in walked.tallies.items()}
        found, found_all = every_cause(conn, CONSOLE_CAUSES_FOUND)
        return grouped(
            tallies,
            walked.exact,
            walked.unread_before,
            found=found,
            found_all=found_all or walked.exact,
            listed=listed,
        )

    def _relays(self, conn: sa.Connection) -> list[RelayPresence]:
        live = conn.execute(
            sa.select(outbox_relays.c.owner, outbox_relays.c.protocol).where(
                outbox_relays.c.alive_until > database_time()
            )
        ).all()
        owned: dict[str, int] = dict(
            conn.execute(
                sa.select(outbox_buckets.c.owner, sa.func.count())
                .where(outbox_buckets.c.lease_until > database_time())
                .group_by(outbox_buckets.c.owner)
            ).all()
        )
        protocols = {r.owner: int(r.protocol or PROTOCOL_BEFORE_FENCES) for r in live}
        for owner in owned:
            protocols.setdefault(owner, PROTOCOL_BEFORE_FENCES)
        least = conn.execute(sa.select(sa.func.max(outbox_protocol.c.least_protocol)))
        least_protocol = int(least.scalar_one_or_none() or PROTOCOL_BEFORE_FENCES)
        presences = []
        for owner, protocol in sorted(protocols.items()):
            others = {o: p for o, p in protocols.items() if o != owner}
            holding = [p for o, p in others.items() if owned.get(o)]
            state = fence(protocol, holding, others.values(), least_protocol, others.values())
            presences.append(
                RelayPresence(
                    owner=readable_text(owner),
                    protocol=protocol,
                    buckets=int(owned.get(owner, 0)),
                    fence="" if state is None else state.value,
                )
            )
        return presences

    def page(
        self, chosen: ParkedFilter, after: Cursor | None, limit: int
    ) -> tuple[list[RowSummary], Cursor | None]:
        """A page of the parked rows ``chosen`` selects, most recently parked first, after
        ``after`` (keyset pagination: the page's cost does not grow with its depth); and the
        cursor of the next page, if there is one."""
        where = parked_where(chosen)
        if after is not None:
            where.append(
                sa.or_(
                    parked_time < after.parked_at,
                    sa.and_(parked_time == after.parked_at, outbox.c.id < after.id),
                )
            )
        statement = (
            sa.select(*cut_texts(SUMMARY_COLUMNS))
            .where(*where)
            .order_by(parked_time.desc(), outbox.c.id.desc())
            .limit(limit + 1)
        )
        with db_errors("console page", self.where), self.engine.connect() as conn:
            rows = [summary(r) for r in conn.execute(statement)]
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, Cursor(rows[-1].parked_at, rows[-1].id) if more and rows else None

    def count(self, chosen: ParkedFilter, bound: datetime) -> Counted:
        """How many parked rows ``chosen`` selects that were parked by ``settled(bound)``
        (what a bulk action would change): exact, unless counting them all would pass the
        budget (then a lower bound counted: the action itself still changes every one).
        What it would leave is ``ConsoleActions.left_after``'s."""
        within = sa.case(
            (parked_time <= settled(bound), sa.literal_column("1")), else_=sa.literal_column("0")
        )
        with db_errors("console count", self.where), self.engine.connect() as conn:
            walked = walk(conn, [within], parked_where(chosen), self.budget)
        taken = sum(tally.rows for (value,), tally in walked.tallies.items() if int(value))
        return Counted(taken, walked.exact)

    def row(self, row_id: int, preview: int) -> RowDetail | None:
        with db_errors("console row", self.where), self.engine.connect() as conn:
            return console_rows.row_detail(conn, row_id, preview)

    def payload(self, row_id: int) -> tuple[str, bytes] | None:
        with db_errors("console payload", self.where), self.engine.connect() as conn:
            return console_rows.payload(conn, row_id)

    def archived(self, chosen: ArchiveFilter, after: int | None, limit: int) -> list[RowSummary]:
        with db_errors("console archive", self.where), self.engine.connect() as conn:
            return console_archive.listed(conn, chosen, after, limit)

    def count_archived(self, chosen: ArchiveFilter, bound: datetime) -> tuple[Counted, LeftAfter]:
        """What a restore by filter drawn at ``bound`` takes, and leaves
        (``console_archive.counted``)."""
        with db_errors("console count", self.where), self.engine.connect() as conn:
            return console_archive.counted(conn, chosen, bound)

    def audit(self, chosen: AuditFilter, after: int | None, limit: int) -> list[AuditEntry]:
        with db_errors("console audit", self.where), self.engine.connect() as conn:
            return console_rows.audit(conn, chosen, after, limit)

    def session_ended(self, session_id: str) -> bool:
        """Whether the session ``session_id`` was ended (logged out) before its time."""
        found = sa.select(console_sessions_ended.c.session_id).where(
            console_sessions_ended.c.session_id == session_id
        )
        with db_errors("console session", self.where), self.engine.connect() as conn:
            return conn.execute(found).first() is not None

    def close(self) -> None:
        self.engine.dispose()
