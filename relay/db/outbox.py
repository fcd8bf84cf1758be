"""The outbox as writers and operators see it: durable inserts, status, replay, purge.

Every write here must survive a database crash once it has returned (a writer was told its
message is in the outbox; an operator was told rows were replayed), so these engines use
plain durable sessions, unlike the relay's claims (``relay.db.claims``). Each write is short:
replay changes only the rows it moves back, and purge deletes sent rows in chunks of their own
transactions, so neither holds locks that would stall the relays. Times are the database's
(``relay.db.clock``): a new row's are the column defaults, and ages and cut-offs are computed
in SQL, whatever this host's clock says.
"""

from __future__ import annotations

import functools
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import sqlalchemy as sa

from relay.admin_records import OutboxStatus, RecentSent, Selection
from relay.constants import BACKLOG_EXACT_ROWS, IDS_PER_STATEMENT, PURGE_CHUNK, RECENT_SENT_S
from relay.db.clock import database_time, seconds_between
from relay.db.decode import readable_text
from relay.db.dialects import of
from relay.db.due import due_backlog
from relay.db.engine import create_engine, db_errors, transaction
from relay.db.schema import (
    DUPLICATES,
    ROW_COLUMNS,
    outbox,
    outbox_buckets,
    outbox_counters,
    outbox_sent,
    outbox_sent_legacy,
)
from relay.db.sentlog import entries, purge_chunk
from relay.db.sentruns import purge_chunk as runs_purge_chunk
from relay.db.statements import bounded_count, in_chunks, replayed, run_delete
from relay.records import (
    PARKED,
    PENDING,
    SENT,
    STATUSES,
    NewMessage,
    OutboxRow,
)
from relay.redact import redact_url


class OutboxWriter:
    """Inserts messages (``relay enqueue``, tests, applications in Python)."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self._where = redact_url(url)

    def enqueue(self, messages: Sequence[NewMessage]) -> list[str]:
        """Insert ``messages`` in one transaction; returns their message ids. Their
        ``created_at`` and ``next_attempt_at`` are the database's (the column defaults). A
        message id still in the outbox fails the whole call (StoreError: a duplicate key); one
        sent before goes in, and the relay drops it unpublished."""
        ids = [m.message_id or str(uuid.uuid4()) for m in messages]
        if not messages:
            return ids
        rows = [
            {
                "message_id": message_id,
                "exchange": m.exchange,
                "routing_key": m.routing_key,
                "payload": m.payload,
                "content_type": m.content_type,
                "headers": m.headers,
                "ordering_key": m.ordering_key,
            }
            for m, message_id in zip(messages, ids, strict=True)
        ]
        with transaction(self.engine, "enqueue", self._where) as conn:
            conn.execute(sa.insert(outbox), rows)
        return ids

    def close(self) -> None:
        self.engine.dispose()


class OutboxAdmin:
    """The operator's reads and writes (``relay status``, ``replay``, ``purge``, and the
    relay's retention, which runs in a relay's bounded sessions: ``relay_session``)."""

    def __init__(self, url: str, *, relay_session: bool = False) -> None:
        self.engine = create_engine(url, relay_session=relay_session)
        self._where = redact_url(url)

    def status(self, reasons: int = 10) -> OutboxStatus:
        """Every count is one walk of an index, bounded (``relay.db.statements.bounded_count``):
        milliseconds at any backlog and any history."""
        pending = outbox.c.status == PENDING
        ids = sa.select(outbox.c.id)
        counted = {
            PENDING: [ids.where(pending)],
            SENT: [
                ids.where(outbox.c.status == SENT),
                *(sa.select(log.c.key) for log in (outbox_sent, outbox_sent_legacy)),
            ],
            PARKED: [ids.where(outbox.c.status == PARKED)],
        }
        logged = entries(of(self.engine).journals_sent_log)
        recent = [
            sa.select(
                sa.func.count(),
                sa.func.sum(seconds_between(t.c.created_at, t.c.sent_at)),
                sa.func.max(seconds_between(t.c.created_at, t.c.sent_at)),
            ).where(t.c.sent_at > database_time(-RECENT_SENT_S), *where)
            for t, where in ((outbox, [outbox.c.status == SENT]), (logged, []))
        ]
        by_reason = (
            sa.select(outbox.c.last_error, sa.func.count().label("rows"))
            .where(outbox.c.status == PARKED)
            .group_by(outbox.c.last_error)
            .order_by(sa.desc("rows"), outbox.c.last_error)
            .limit(reasons)
        )
        retrying = (
            sa.select(outbox.c.exchange, outbox.c.last_error, sa.func.count().label("rows"))
            .where(pending, outbox.c.attempts > 0)
            .group_by(outbox.c.exchange, outbox.c.last_error)
            .order_by(sa.desc("rows"), outbox.c.exchange, outbox.c.last_error)
            .limit(reasons)
        )
        owners = (
            sa.select(outbox_buckets.c.owner, sa.func.count().label("buckets"))
            .where(outbox_buckets.c.lease_until > database_time())
            .group_by(outbox_buckets.c.owner)
            .order_by(outbox_buckets.c.owner)
        )
        dropped = sa.select(outbox_counters.c.value).where(outbox_counters.c.name == DUPLICATES)
        with db_errors("status", self._where), self.engine.connect() as conn:

            def count(rows: sa.Select[Any]) -> int:
                return bounded_count(conn, rows, BACKLOG_EXACT_ROWS)

            counts = {s: sum(map(count, counted[s])) for s in STATUSES}
            backlog = due_backlog(conn, BACKLOG_EXACT_ROWS)
            relays = {r.owner: int(r.buckets) for r in conn.execute(owners)}
            # Shown as they are stored, but for bytes that are not UTF-8 (SQLite keeps any).
            parked = [
                (readable_text(r.last_error or ""), int(r.rows)) for r in conn.execute(by_reason)
            ]
            again = [
                (readable_text(r.exchange), readable_text(r.last_error or ""), int(r.rows))
                for r in conn.execute(retrying)
            ]
            sums = [conn.execute(q).one() for q in recent]
            duplicates = conn.execute(dropped).scalar_one_or_none() or 0
        messages = sum(int(n) for n, _, _ in sums)
        return OutboxStatus(
            counts,
            backlog.due,
            backlog.oldest_due_age,
            relays,
            parked,
            again,
            RecentSent(
                messages,
                sum(float(total or 0) for _, total, _ in sums) / messages if messages else 0.0,
                max(float(most or 0) for _, _, most in sums),
            ),
            int(duplicates),
        )

    def replay(
        self, selection: Selection, dry_run: bool, sent: bool = False, shown: int = 20
    ) -> tuple[int, list[OutboxRow]]:
        """Move the selected parked rows (with ``sent``: sent rows kept whole) back to
        pending, due now, with their attempts reset, in one transaction; returns how many,
        and the first ``shown`` of them (as they were) in id order. With ``dry_run``, changes
        nothing. A replayed sent row keeps its message id: it is the same message, delivered
        once more. Only ids are held in memory, whatever the selection's size."""
        status = SENT if sent else PARKED
        where = [outbox.c.status == status, *_narrowed(outbox, selection)]
        if selection.reason:
            where.append(outbox.c.last_error.contains(selection.reason, autoescape=True))
        if selection.exchange is not None:
            where.append(outbox.c.exchange == selection.exchange)
        chosen = sa.select(outbox.c.id).where(*where).order_by(outbox.c.id)
        first = sa.select(*ROW_COLUMNS).where(of(self.engine).id_in(outbox.c.id))
        replay = (
            sa.update(outbox)
            .where(outbox.c.status == status)
            .where(of(self.engine).id_in(outbox.c.id))
            .values(replayed())
        )
        with transaction(self.engine, "replay", self._where) as conn:
            ids = list(conn.scalars(chosen))
            rows = conn.execute(first.order_by(outbox.c.id), {"ids": ids[:shown]})
            rows_shown = [OutboxRow(**r._mapping) for r in rows]
            for i in range(0, 0 if dry_run else len(ids), IDS_PER_STATEMENT):
                conn.execute(replay, {"ids": ids[i : i + IDS_PER_STATEMENT]})
        return len(ids), rows_shown

    def not_kept(self, selection: Selection) -> int:
        """How many sent messages of the selection only the sent log remembers (acked with
        ``keep_sent = ids``): their rows are gone, so they cannot be replayed. The log keeps
        no exchange and no error, so only the selection's ids and times narrow this count
        (exact up to ``BACKLOG_EXACT_ROWS``, then an estimate)."""
        logged = entries(of(self.engine).journals_sent_log)
        selected = sa.select(logged.c.key).where(*_narrowed(logged, selection))
        with db_errors("replay", self._where), self.engine.connect() as conn:
            return bounded_count(conn, selected, BACKLOG_EXACT_ROWS)

    def purge(
        self,
        older_than: float,
        chunk: int = PURGE_CHUNK,
        progress: Callable[[int], None] | None = None,
        stop: threading.Event | None = None,
    ) -> int:
        """Delete the messages sent more than ``older_than`` seconds ago (by the database's
        clock): sent rows kept whole, then the sent log's entries, ``chunk`` per transaction;
        returns how many. ``progress`` is told the total after each full chunk; a set
        ``stop`` ends the purge after the chunk under way (the relay's shutdown waits for
        one at most).

        Sent rows are found in their sent-time index, oldest first; the sent log's entries
        are in the order they were sent, so its old ones are its first pages. Where the log
        is journaled (``relay.db.sentlog``), the journal's oldest rows are deleted with the
        log's entries they hold, found by their keys (the log has no time index there)."""
        cutoff = database_time(-older_than)
        sent_rows = (
            sa.select(outbox.c.id)
            .where(outbox.c.status == SENT, outbox.c.sent_at < cutoff)
            .order_by(outbox.c.sent_at)
            .limit(chunk)
        )
        delete_rows = sa.delete(outbox).where(
            of(self.engine).id_in(outbox.c.id), outbox.c.status == SENT
        )

        def rows_chunk(conn: sa.Connection) -> int:
            batch = list(conn.scalars(sent_rows))
            if batch:
                conn.execute(delete_rows, {"ids": batch})
            return len(batch)

        parts = [
            rows_chunk,
            self._log_chunk(cutoff, chunk),
            # The log of the releases before (``outbox_sent_legacy``).
            self._by_sent_time(outbox_sent_legacy, cutoff, chunk),
        ]
        if of(self.engine).journals_sent_log:
            parts.append(runs_purge_chunk(cutoff, chunk))
        deleted = 0
        for one_chunk in parts:
            before = deleted  # ``progress`` is told the total of every part

            def so_far(count: int, before: int = before) -> None:
                if progress is not None:
                    progress(before + count)

            deleted += in_chunks(
                self.engine,
                one_chunk,
                chunk=chunk,
                what="purge",
                where=self._where,
                stop=stop,
                progress=so_far,
            )
        return deleted

    def _log_chunk(
        self, cutoff: sa.ColumnElement[Any], chunk: int
    ) -> Callable[[sa.Connection], int]:
        """The purge of ``chunk`` of the sent log's entries sent before ``cutoff``."""
        if of(self.engine).journals_sent_log:
            return purge_chunk(cutoff, chunk)
        return self._by_sent_time(outbox_sent, cutoff, chunk)

    def _by_sent_time(
        self, log: sa.Table, cutoff: sa.ColumnElement[Any], chunk: int
    ) -> Callable[[sa.Connection], int]:
        """The purge of ``chunk`` of a logged sent log's entries sent before ``cutoff``, found
        by its sent-time index."""
        old = log.c.sent_at < cutoff
        delete = of(self.engine).delete_chunk(log, log.c.key, old, chunk, None)
        return functools.partial(run_delete, delete)

    def close(self) -> None:
        self.engine.dispose()


def _narrowed(table: sa.FromClause, selection: Selection) -> list[sa.ColumnElement[bool]]:
    """The parts of ``selection`` that the outbox and the sent log can both answer: ids and
    times (ages by the database's clock)."""
    where: list[sa.ColumnElement[bool]] = []
    if selection.ids:
        where.append(table.c.id.in_(selection.ids))
    if selection.first_id is not None:
        where.append(table.c.id >= selection.first_id)
    if selection.last_id is not None:
        where.append(table.c.id <= selection.last_id)
    if selection.older_than is not None:
        where.append(table.c.created_at < database_time(-selection.older_than))
    if selection.sent_since is not None:
        where.append(table.c.sent_at >= selection.sent_since)
    if selection.sent_until is not None:
        where.append(table.c.sent_at < selection.sent_until)
    return where
