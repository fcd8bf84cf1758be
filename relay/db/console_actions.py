"""The operator console's changes: replay, discard (to the archive) and restore parked rows, an
admin's edited copy, each with its audit entry written in the same transaction as the
change (``console_audit``).

Pinned to what the operator saw: a change names the ids, or a filter and the bound (the
database's time when the page was drawn); a row parked after the bound is reported, never
changed; a cause is decided of each row the change reads (``relay.db.console_matching``).
A bulk change goes in chunks of ``CONSOLE_CHUNK_ROWS``, each its own short transaction,
which locks parked rows only (no writer touches those) and updates its audit entry's count
(an entry says what committed, even of a change cut short), then a pause as long as the
chunk took (``CONSOLE_CHUNK_PAUSE_SHARE``). Its entry ends saying what it left and why.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from relay.console_constants import CONSOLE_CHUNK_PAUSE_SHARE, CONSOLE_CHUNK_ROWS, CONSOLE_NAMED_IDS
from relay.console_records import (
    LEFT_AS_SHOWN,
    LEFT_BY_RESTORE,
    ActionResult,
    Actor,
    ArchiveFilter,
    LeftAfter,
    ParkedFilter,
)
from relay.db.clock import database_time
from relay.db.console import settled
from relay.db.console_archive import (
    archived,
    archived_matching,
    archived_since,
    restored,
)
from relay.db.console_audit_log import (
    DISCARD,
    EDIT,
    REPLAY,
    RESTORE,
    failed,
    logged,
    target_of,
)
from relay.db.console_counts import parked_time
from relay.db.console_matching import matching, parked_since
from relay.db.dialects import of
from relay.db.engine import create_engine, transaction
from relay.db.schema import (
    console_audit,
    console_sessions_ended,
    outbox,
    outbox_archive,
    outbox_edits,
)
from relay.db.statements import replayed
from relay.errors import InputError, StoreError
from relay.records import PARKED
from relay.redact import redact_url

log = logging.getLogger(__name__)

# What a chunk does to the ids it is given, on a connection in its transaction: the ids it
# changed (the rest it left, and names).
Chunk = Callable[[sa.Connection, list[int]], list[int]]


class ConsoleActions:
    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)
        of(self.engine).short_reads(self.engine)
        self.where = redact_url(url)

    def replay(
        self, actor: Actor, ids: Sequence[int] | None, chosen: ParkedFilter | None, bound: Any
    ) -> ActionResult:
        """The chosen parked rows back to pending, due now, their attempts reset."""
        drawn, bound = bound, _pinned(chosen, bound)
        back = sa.update(outbox).where(of(self.engine).id_in(outbox.c.id)).values(replayed())

        def chunk(conn: sa.Connection, batch: list[int]) -> list[int]:
            # The rows locked first, then changed: which of the batch it left is named
            # (an UPDATE's row count would not say which; MariaDB's UPDATE returns none).
            locked = _parked_by(conn, batch, bound)
            if locked:
                conn.execute(back, {"ids": locked})
            return locked

        return self._parked_change(
            actor, REPLAY, chunk, ids=ids, chosen=chosen, bound=bound, drawn=drawn
        )

    def discard(
        self, actor: Actor, ids: Sequence[int] | None, chosen: ParkedFilter | None, bound: Any
    ) -> ActionResult:
        """The chosen parked rows out of the outbox, whole, into the archive."""
        drawn, bound = bound, _pinned(chosen, bound)

        def chunk(conn: sa.Connection, batch: list[int]) -> list[int]:
            locked = _parked_by(conn, batch, bound)
            if locked:
                archived(conn, locked, actor.name)
            return locked

        return self._parked_change(
            actor, DISCARD, chunk, ids=ids, chosen=chosen, bound=bound, drawn=drawn
        )

    def restore(
        self,
        actor: Actor,
        ids: Sequence[int] | None,
        chosen: ArchiveFilter | None = None,
        bound: Any = None,
    ) -> ActionResult:
        """Archived rows back into the outbox as they were, parked (from now): those named,
        or those ``chosen`` selects that were archived by ``bound`` (the rows archived after
        it named as left). Each keeps its id; one whose message id the outbox holds again
        meanwhile stays archived, named as left."""
        left = LEFT_BY_RESTORE
        if ids is not None:
            target = target_of(ids, None, None)
            return self._chunks(actor, RESTORE, target, _batches(ids), restored, left_as=left)
        if chosen is None or bound is None:
            raise InputError("name the rows, or a filter and its bound")
        return self._chunks(
            actor,
            RESTORE,
            target_of(None, chosen, bound),
            archived_matching(self.engine, self.where, chosen, bound),
            restored,
            since=lambda: archived_since(self.engine, self.where, chosen, bound),
            since_as="archived",
            left_as=left,
        )

    def edit(self, actor: Actor, row_id: int, changes: dict[str, Any]) -> ActionResult:
        """A copy of a parked or archived row with ``changes`` (exchange, routing_key,
        content_type, headers, payload), as a new pending row with a new id and message id;
        the original stays as it is, each linked to the other."""
        unknown = set(changes) - {"exchange", "routing_key", "content_type", "headers", "payload"}
        if unknown:
            raise InputError(f"cannot edit {', '.join(sorted(unknown))}")
        source = outbox if _in(self.engine, outbox, row_id) else outbox_archive
        target = json.dumps({"id": row_id, "changed": sorted(changes)})
        try:
            copy_id = self._copy(actor, source, row_id, changes, target)
        except Exception as exc:
            self._ended(actor, EDIT, target, None, rows=0, result=failed(0, exc))
            raise
        logged(actor, EDIT, target, 1, f"copy {copy_id}")
        return ActionResult(1, new_ids=(copy_id,))

    def _copy(
        self, actor: Actor, source: sa.Table, row_id: int, changes: dict[str, Any], target: str
    ) -> int:
        with transaction(self.engine, "console edit", self.where) as conn:
            original = conn.execute(sa.select(source).where(source.c.id == row_id)).one_or_none()
            if original is None or getattr(original, "status", PARKED) != PARKED:
                raise InputError(f"row {row_id} is not parked or archived")
            values = {
                "message_id": str(uuid.uuid4()),
                "exchange": original.exchange,
                "routing_key": original.routing_key,
                "payload": original.payload,
                "content_type": original.content_type,
                "headers": original.headers,
                "ordering_key": original.ordering_key,
                **changes,
            }
            copy_id = _new_id(conn.execute(sa.insert(outbox).values(values)))
            conn.execute(
                sa.insert(outbox_edits).values(
                    copy_id=copy_id, original_id=row_id, edited_by=actor.name
                )
            )
            self._audit(conn, actor, EDIT, target=target, rows=1, result=f"copy {copy_id}")
        return copy_id

    def end_session(self, session_id: str, ends_at: datetime) -> None:
        """The session ``session_id`` ended now (a logout), refused until ``ends_at`` (its
        lifetime's end); sessions whose lifetime is over are forgotten."""
        ended = console_sessions_ended
        with transaction(self.engine, "console logout", self.where) as conn:
            conn.execute(sa.delete(ended).where(ended.c.ends_at < database_time()))
            known = sa.select(ended.c.session_id).where(ended.c.session_id == session_id)
            if conn.execute(known).first() is None:
                conn.execute(sa.insert(ended).values(session_id=session_id, ends_at=ends_at))

    def record(self, actor: Actor, action: str, target: str, rows: int, result: str) -> None:
        """An audit entry for a change made elsewhere (the broker's dead letters), written
        as soon as it is done: no transaction spans the broker and the database."""
        with transaction(self.engine, "console audit", self.where) as conn:
            self._audit(conn, actor, action, target=target, rows=rows, result=result)
        logged(actor, action, target, rows, result)

    def _parked_change(
        self,
        actor: Actor,
        action: str,
        chunk: Chunk,
        *,
        ids: Sequence[int] | None,
        chosen: ParkedFilter | None,
        bound: Any,
        drawn: Any,
    ) -> ActionResult:
        """``bound``: the latest parking time the change takes; ``drawn``: when its page was
        drawn, as its audit entry says it."""
        target = target_of(ids, chosen, drawn)
        if ids is not None:
            return self._chunks(actor, action, target, _batches(ids), chunk)
        if chosen is None:
            raise InputError("name the rows, or a filter")
        return self._chunks(
            actor,
            action,
            target,
            matching(self.engine, self.where, chosen, bound),
            chunk,
            since=lambda: parked_since(self.engine, self.where, chosen, bound),
        )

    def _chunks(
        self,
        actor: Actor,
        action: str,
        target: str,
        batches: Iterator[list[int]],
        chunk: Chunk,
        *,
        since: Callable[[], LeftAfter] = lambda: LeftAfter(0, ()),
        since_as: str = "parked",
        left_as: str = LEFT_AS_SHOWN,
    ) -> ActionResult:
        """The chunks run, the audit entry (written with the first) counting each; it ends
        with the change's result (``ActionResult.audited``: what it left, named, and why: the
        rows a chunk was given that it did not change, and ``since``, the rows parked after
        the bound), or ``failed`` with the rows changed so far and the error's class, written
        even when the change fails."""
        changed = chosen = 0
        left_ids: list[int] = []
        audit_id: int | None = None
        try:
            for batch in batches:
                began = time.monotonic()
                chosen += len(batch)
                with transaction(self.engine, f"console {action}", self.where) as conn:
                    done = set(chunk(conn, batch))
                    changed += len(done)
                    if audit_id is None:
                        audit_id = self._audit(
                            conn, actor, action, target=target, rows=changed, result="running"
                        )
                    else:
                        conn.execute(
                            sa.update(console_audit)
                            .where(console_audit.c.id == audit_id)
                            .values(rows=changed)
                        )
                left_ids = [*left_ids, *(i for i in batch if i not in done)][:CONSOLE_NAMED_IDS]
                # Paced: the database's time between chunks is the writers'.
                time.sleep((time.monotonic() - began) * CONSOLE_CHUNK_PAUSE_SHARE)
            later, named = since(), tuple(left_ids)
            left = chosen - changed
            result = ActionResult(
                changed,
                left,
                later.rows,
                left_ids=named,
                since_ids=later.ids,
                since_as=since_as,
                left_as=left_as,
            )
        except Exception as exc:
            self._ended(actor, action, target, audit_id, rows=changed, result=failed(changed, exc))
            raise
        self._ended(actor, action, target, audit_id, rows=changed, result=result.audited())
        return result

    def _ended(
        self,
        actor: Actor,
        action: str,
        target: str,
        audit_id: int | None,
        *,
        rows: int,
        result: str,
    ) -> None:
        """A change's audit entry given its result (written now if no chunk wrote it), and
        logged. After a failure the database may fail again: that is logged, and the
        change's own error is the one raised."""
        try:
            with transaction(self.engine, f"console {action}", self.where) as conn:
                if audit_id is None:
                    self._audit(conn, actor, action, target=target, rows=rows, result=result)
                else:
                    conn.execute(
                        sa.update(console_audit)
                        .where(console_audit.c.id == audit_id)
                        .values(rows=rows, result=result)
                    )
        except StoreError as exc:
            log.error(
                "console %s: its audit entry could not say its result: %s",
                action,
                exc,
                extra={"action": "console_audit_failed"},
            )
        logged(actor, action, target, rows, result)

    def _audit(
        self, conn: sa.Connection, actor: Actor, action: str, *, target: str, rows: int, result: str
    ) -> int:
        entry = sa.insert(console_audit).values(
            at=database_time(),  # as the archive's time: in microseconds on SQLite too
            actor=actor.name,
            role=actor.role,
            action=action,
            target=target,
            rows=rows,
            result=result,
        )
        return _new_id(conn.execute(entry))

    def left_after(self, chosen: ParkedFilter, bound: Any) -> LeftAfter:
        """The parked rows a change by ``chosen`` drawn at ``bound`` would leave, were it made
        now (parked after ``settled(bound)``): counted, the first named, for its confirm
        page."""
        return parked_since(self.engine, self.where, chosen, _pinned(chosen, bound))

    def close(self) -> None:
        self.engine.dispose()


def _pinned(chosen: ParkedFilter | None, bound: Any) -> Any:
    """The latest parking time a change takes: the page's bound for the rows it showed
    (ids: committed when it was drawn), ``settled(bound)`` for a filter's."""
    return bound if chosen is None else settled(bound)


def _new_id(inserted: sa.CursorResult[Any]) -> int:
    key = inserted.inserted_primary_key
    assert key is not None
    return int(key[0])


def _batches(ids: Sequence[int]) -> Iterator[list[int]]:
    unique = sorted(set(ids))
    for start in range(0, len(unique), CONSOLE_CHUNK_ROWS):
        yield unique[start : start + CONSOLE_CHUNK_ROWS]


def _parked_by(conn: sa.Connection, batch: list[int], bound: Any) -> list[int]:
    """Of ``batch``, the ids of rows still parked by ``bound`` (as the page showed them),
    locked for the chunk's change."""
    return [
        int(i)
        for i in conn.scalars(
            sa.select(outbox.c.id)
            .where(of(conn).id_in(outbox.c.id), outbox.c.status == PARKED)
            .where(parked_time <= bound)
            .with_for_update(),
            {"ids": batch},
        )
    ]


def _in(engine: sa.Engine, table: sa.Table, row_id: int) -> bool:
    with transaction(engine, "console edit", redact_url(str(engine.url))) as conn:
        return conn.execute(sa.select(table.c.id).where(table.c.id == row_id)).first() is not None
