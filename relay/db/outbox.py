"""The outbox as writers and operators see it: durable inserts, status, replay, purge.

Every write here must survive a database crash once it has returned (a writer was told its
message is in the outbox; an operator was told rows were replayed), so these engines use
plain durable sessions, unlike the relay's claims (``relay.db.claims``). Each write is short:
replay changes only parked rows, and purge deletes sent rows in chunks of their own
transactions, so neither holds locks that would stall the relays. Times are the database's
(``relay.db.clock``): a new row's are the column defaults, and ages and cut-offs are computed
in SQL, whatever this host's clock says.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence

import sqlalchemy as sa

from relay.constants import IDS_PER_STATEMENT, PURGE_CHUNK
from relay.db.clock import database_time, seconds_since
from relay.db.engine import create_engine, db_errors, id_in, transaction
from relay.db.schema import ROW_COLUMNS, outbox
from relay.records import (
    PARKED,
    PENDING,
    SENT,
    STATUSES,
    NewMessage,
    OutboxRow,
    OutboxStatus,
    Selection,
)
from relay.settings import redact_url


class OutboxWriter:
    """Inserts messages (``relay enqueue``, tests, applications in Python)."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self._where = redact_url(url)

    def enqueue(self, messages: Sequence[NewMessage]) -> list[str]:
        """Insert ``messages`` in one transaction; returns their message ids. Their
        ``created_at`` and ``next_attempt_at`` are the database's (the column defaults)."""
        ids = [m.message_id or str(uuid.uuid4()) for m in messages]
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
        if rows:
            with transaction(self.engine, "enqueue", self._where) as conn:
                conn.execute(sa.insert(outbox), rows)
        return ids

    def close(self) -> None:
        self.engine.dispose()


class OutboxAdmin:
    """The operator's reads and writes (``relay status``, ``replay``, ``purge``, and the
    relay's retention)."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        self._where = redact_url(url)

    def status(self, reasons: int = 10) -> OutboxStatus:
        pending = outbox.c.status == PENDING
        now = database_time()
        due = sa.and_(pending, outbox.c.next_attempt_at <= now)
        leased = sa.and_(pending, outbox.c.lease_owner.is_not(None), outbox.c.next_attempt_at > now)
        totals = sa.select(
            *(sa.func.count().filter(outbox.c.status == s) for s in STATUSES),
            sa.func.count().filter(due),
            seconds_since(sa.func.min(outbox.c.next_attempt_at).filter(due)),
            sa.func.count().filter(leased),
        )
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
        with db_errors("status", self._where), self.engine.connect() as conn:
            *counts, due_rows, age, leased_rows = conn.execute(totals).one()
            parked = [(r.last_error or "", int(r.rows)) for r in conn.execute(by_reason)]
            again = [(r.exchange, r.last_error or "", int(r.rows)) for r in conn.execute(retrying)]
        return OutboxStatus(
            dict(zip(STATUSES, map(int, counts), strict=True)),
            int(due_rows),
            max(0.0, age or 0.0),
            int(leased_rows),
            parked,
            again,
        )

    def replay(self, selection: Selection, dry_run: bool) -> list[OutboxRow]:
        """Move the selected parked rows back to pending, due now, with their attempts reset;
        returns them (as they were) in id order. With ``dry_run``, changes nothing."""
        where = [outbox.c.status == PARKED]
        if selection.ids:
            where.append(outbox.c.id.in_(selection.ids))
        if selection.first_id is not None:
            where.append(outbox.c.id >= selection.first_id)
        if selection.last_id is not None:
            where.append(outbox.c.id <= selection.last_id)
        if selection.reason:
            where.append(outbox.c.last_error.contains(selection.reason, autoescape=True))
        if selection.exchange is not None:
            where.append(outbox.c.exchange == selection.exchange)
        if selection.older_than is not None:
            where.append(outbox.c.created_at < database_time(-selection.older_than))
        chosen = sa.select(*ROW_COLUMNS).where(*where).order_by(outbox.c.id)
        replay = (
            sa.update(outbox)
            .where(outbox.c.status == PARKED)
            .where(id_in(outbox.c.id, self.engine.dialect))
            .values(status=PENDING, attempts=0, next_attempt_at=database_time(), lease_owner=None)
        )
        with transaction(self.engine, "replay", self._where) as conn:
            rows = [OutboxRow(**r._mapping) for r in conn.execute(chosen)]
            for i in range(0, 0 if dry_run else len(rows), IDS_PER_STATEMENT):
                conn.execute(replay, {"ids": [r.id for r in rows[i : i + IDS_PER_STATEMENT]]})
        return rows

    def purge(
        self,
        older_than: float,
        chunk: int = PURGE_CHUNK,
        progress: Callable[[int], None] | None = None,
        stop: threading.Event | None = None,
    ) -> int:
        """Delete rows sent more than ``older_than`` seconds ago (by the database's clock),
        ``chunk`` rows per transaction, walking the primary key so that every chunk is as
        cheap as the first; returns the rows deleted. ``progress`` is told the total after
        each full chunk; a set ``stop`` ends the purge after the chunk under way (the
        relay's shutdown waits for one at most)."""
        ids = (
            sa.select(outbox.c.id)
            .where(
                outbox.c.id > sa.bindparam("after"),
                outbox.c.status == SENT,
                outbox.c.sent_at < database_time(-older_than),
            )
            .order_by(outbox.c.id)
            .limit(chunk)
        )
        delete = sa.delete(outbox).where(
            id_in(outbox.c.id, self.engine.dialect), outbox.c.status == SENT
        )
        deleted, after = 0, 0
        while stop is None or not stop.is_set():
            with transaction(self.engine, "purge", self._where) as conn:
                batch = list(conn.scalars(ids, {"after": after}))
                if batch:
                    conn.execute(delete, {"ids": batch})
            deleted += len(batch)
            if len(batch) < chunk:
                break
            after = batch[-1]
            if progress is not None:
                progress(deleted)
        return deleted

    def close(self) -> None:
        self.engine.dispose()
