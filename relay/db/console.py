"""The operator console's reads (``relay.console``): the overview, parked rows by cause, a
page of them, one row, the archive and the audit log.

Every read is an index walk bounded by the page or by a count's cap, so that a page costs
milliseconds whatever the outbox holds (``bench.console``): parked rows are read through the
partial indexes of migration 0014, most recently parked first (a parked row's
``next_attempt_at`` is when it was parked), and counts stop at a cap, beyond which the
planner estimates. Times are the database's: ``Overview.drawn_at`` is the bound a page's
actions are pinned to.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from relay.buckets import fence
from relay.console.causes import cause_of
from relay.console.records import (
    AuditEntry,
    CauseGroup,
    Cursor,
    Overview,
    ParkedFilter,
    RelayPresence,
    RowDetail,
    RowSummary,
)
from relay.constants import (
    BACKLOG_EXACT_ROWS,
    CONSOLE_CAUSE_SCAN,
    CONSOLE_SETTLE_HORIZON_S,
    PROTOCOL_BEFORE_FENCES,
)
from relay.db import console_rows
from relay.db.clock import database_time
from relay.db.console_rows import SUMMARY_COLUMNS, parked_time, summary
from relay.db.decode import readable_text
from relay.db.dialects import of
from relay.db.due import due_backlog
from relay.db.engine import create_engine, db_errors
from relay.db.schema import (
    console_sessions_ended,
    outbox,
    outbox_archive,
    outbox_buckets,
    outbox_protocol,
    outbox_relays,
    reason_prefix,
)
from relay.db.sentlog import entries
from relay.db.statements import bounded_count
from relay.records import PARKED, PENDING
from relay.redact import redact_url

# A reason's rows are counted exactly up to this many, and estimated by the planner beyond:
# each counted row is an index entry and its heap tuple (an expression index is never read
# alone), and a million parked rows may hold dozens of reasons (bench.console).
CAUSE_EXACT_ROWS = 100
reason_key = reason_prefix(outbox.c.last_error)


def parked_where(chosen: ParkedFilter) -> list[sa.ColumnElement[bool]]:
    """The conditions of ``chosen`` on the outbox's parked rows, every value bound (never
    spliced into the SQL: a filter may hold any text)."""
    where: list[sa.ColumnElement[bool]] = [outbox.c.status == PARKED]
    if chosen.causes:
        where.append(reason_key.in_(chosen.causes))
    if chosen.reason:
        where.append(outbox.c.last_error.contains(chosen.reason, autoescape=True))
    for column, value in (
        (outbox.c.exchange, chosen.exchange),
        (outbox.c.routing_key, chosen.routing_key),
        (outbox.c.ordering_key, chosen.ordering_key),
        (outbox.c.message_id, chosen.message_id),
    ):
        if value:
            where.append(column == value)
    if chosen.parked_before is not None:
        where.append(parked_time <= chosen.parked_before)
    return where


def settled(bound: datetime) -> datetime:
    """The latest parking time a change by filter takes, of a page drawn at ``bound``: a row
    parked after it may have been committed after the page was drawn
    (``CONSOLE_SETTLE_HORIZON_S``)."""
    return bound - timedelta(seconds=CONSOLE_SETTLE_HORIZON_S)


class ConsoleReads:
    """What the console shows of one outbox database."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        of(self.engine).short_reads(self.engine)
        self.where = redact_url(url)

    def now(self) -> Any:
        with db_errors("console", self.where), self.engine.connect() as conn:
            return conn.execute(sa.select(database_time())).scalar_one()

    def overview(self) -> Overview:
        pending = sa.select(outbox.c.id).where(outbox.c.status == PENDING)
        parked = sa.select(outbox.c.id).where(outbox.c.status == PARKED)
        archived = sa.select(outbox_archive.c.id)
        logged = entries(of(self.engine).journals_sent_log)
        recent = sa.select(logged.c.key).where(logged.c.sent_at > database_time(-60))
        with db_errors("console overview", self.where), self.engine.connect() as conn:
            drawn_at = conn.execute(sa.select(database_time())).scalar_one()
            backlog = due_backlog(conn, BACKLOG_EXACT_ROWS)
            causes, cut = self._causes(conn)
            return Overview(
                database=self.where,
                pending=bounded_count(conn, pending, BACKLOG_EXACT_ROWS),
                due=backlog.due,
                oldest_due_age=backlog.oldest_due_age,
                parked=bounded_count(conn, parked, BACKLOG_EXACT_ROWS),
                sent_last_minute=bounded_count(conn, recent, BACKLOG_EXACT_ROWS),
                causes=causes,
                causes_cut=cut,
                relays=self._relays(conn),
                least_protocol=int(
                    conn.execute(
                        sa.select(sa.func.max(outbox_protocol.c.least_protocol))
                    ).scalar_one_or_none()
                    or PROTOCOL_BEFORE_FENCES
                ),
                archived=bounded_count(conn, archived, BACKLOG_EXACT_ROWS),
                drawn_at=drawn_at,
            )

    def causes(self) -> list[CauseGroup]:
        with db_errors("console causes", self.where), self.engine.connect() as conn:
            return self._causes(conn)[0]

    def _causes(self, conn: sa.Connection) -> tuple[list[CauseGroup], bool]:
        """Parked rows by cause, in one statement: the distinct reason prefixes, one index
        step each (a recursive query: a skip scan), and for each its first and last parking
        time (an index probe each) and its rows counted up to ``CAUSE_EXACT_ROWS`` (an index
        walk that stops there); beyond it, the planner's estimate. Prefixes of one cause
        merged."""
        parked = outbox.c.status == PARKED
        first = sa.select(sa.func.min(reason_key).label("p")).where(parked)
        steps = first.cte("prefixes", recursive=True)
        following = (
            sa.select(sa.func.min(reason_key)).where(parked, reason_key > steps.c.p)
        ).scalar_subquery()
        steps = steps.union_all(sa.select(following).where(steps.c.p.is_not(None)))
        mine = (parked, reason_key == steps.c.p)
        # The limits as literals: bound, PostgreSQL's planner cannot see how little the
        # statement reads, and its estimate brought JIT compilation (1.2 s at 1M rows).
        beyond = (
            sa.select(outbox.c.id)
            .where(*mine)
            .limit(sa.literal_column("1"))
            .offset(sa.literal_column(str(CAUSE_EXACT_ROWS)))
            .scalar_subquery()
        )
        counted = sa.select(sa.func.count()).where(*mine).scalar_subquery()
        statement = (
            sa.select(
                steps.c.p,
                sa.select(sa.func.min(parked_time)).where(*mine).scalar_subquery(),
                sa.select(sa.func.max(parked_time)).where(*mine).scalar_subquery(),
                sa.case((beyond.is_(None), counted), else_=sa.null()),
            )
            .where(steps.c.p.is_not(None))
            .limit(sa.literal_column(str(CONSOLE_CAUSE_SCAN + 1)))
        )
        found = conn.execute(statement).all()
        cut = len(found) > CONSOLE_CAUSE_SCAN
        groups: dict[str, list[tuple[str, int, bool, Any, Any]]] = defaultdict(list)
        for prefix, first_at, last_at, within in found[:CONSOLE_CAUSE_SCAN]:
            rows = sa.select(outbox.c.id).where(parked, reason_key == prefix)
            exact = within
            estimate = None if exact is not None else of(conn).planner_estimate(conn, rows)
            if exact is None and estimate is None:  # no planner to ask (SQLite): counted
                counting = sa.select(sa.func.count()).select_from(rows.subquery())
                exact = conn.execute(counting).scalar_one()
            if exact is None:
                count, estimated = max(CAUSE_EXACT_ROWS + 1, estimate or 0), True
            else:
                count, estimated = int(exact), False
            groups[cause_of(readable_text(prefix))].append(
                (prefix, count, estimated, first_at, last_at)
            )
        causes = [
            CauseGroup(
                cause=cause,
                prefixes=tuple(p for p, *_ in parts),
                rows=sum(n for _, n, *_ in parts),
                estimated=any(e for _, _, e, *_ in parts),
                first_parked=min((f for *_, f, _ in parts if f is not None), default=None),
                last_parked=max((last for *_, last in parts if last is not None), default=None),
            )
            for cause, parts in groups.items()
        ]
        causes.sort(key=lambda g: (-g.rows, g.cause))
        return causes, cut

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
            sa.select(*SUMMARY_COLUMNS)
            .where(*where)
            .order_by(parked_time.desc(), outbox.c.id.desc())
            .limit(limit + 1)
        )
        with db_errors("console page", self.where), self.engine.connect() as conn:
            rows = [summary(r) for r in conn.execute(statement)]
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, Cursor(rows[-1].parked_at, rows[-1].id) if more and rows else None

    def count(self, chosen: ParkedFilter, bound: datetime) -> tuple[int, int]:
        """How many parked rows ``chosen`` selects that were parked by ``settled(bound)``
        (what a bulk action would change), and how many later (what it leaves): exact, as
        an operator confirms them."""
        where = parked_where(chosen)
        total = sa.select(sa.func.count()).where(*where)
        last = settled(bound)
        with db_errors("console count", self.where), self.engine.connect() as conn:
            within = conn.execute(total.where(parked_time <= last)).scalar_one()
            since = conn.execute(total.where(parked_time > last)).scalar_one()
        return int(within), int(since)

    def row(self, row_id: int, preview: int) -> RowDetail | None:
        with db_errors("console row", self.where), self.engine.connect() as conn:
            return console_rows.row_detail(conn, row_id, preview)

    def archived(self, after: int | None, limit: int) -> list[RowSummary]:
        with db_errors("console archive", self.where), self.engine.connect() as conn:
            return console_rows.archived(conn, after, limit)

    def audit(self, after: int | None, limit: int) -> list[AuditEntry]:
        with db_errors("console audit", self.where), self.engine.connect() as conn:
            return console_rows.audit(conn, after, limit)

    def session_ended(self, session_id: str) -> bool:
        """Whether the session ``session_id`` was ended (logged out) before its time."""
        found = sa.select(console_sessions_ended.c.session_id).where(
            console_sessions_ended.c.session_id == session_id
        )
        with db_errors("console session", self.where), self.engine.connect() as conn:
            return conn.execute(found).first() is not None

    def close(self) -> None:
        self.engine.dispose()
