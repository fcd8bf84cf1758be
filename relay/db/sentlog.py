"""The sent log's completeness, its journal, and its rebuild from the journal.

Where the database journals the sent log (PostgreSQL: ``Dialect.journals_sent_log``,
``relay.db.schema.outbox_sent_journal`` says why), the log is UNLOGGED: a crash of the server,
or a failover to a standby, empties it and its state row. A claim takes no row while the state
row does not say the log is complete (``complete``): it could not tell a message id sent
before from a new one. A relay that finds it so rebuilds the log from the journal
(``SentLogRebuild``), a slice of the journal per transaction, so that each statement stays
well within the relay's statement timeout; the state row keeps the rebuild's place under a
row lock, so that relays never copy the same slice at once, and one that stops half-way
leaves its place to the next. Acks go on meanwhile and log their entries in both; an entry
the rebuild copies again is written once (the log's key is unique).

Elsewhere the log is never emptied behind the relays' backs; a state row deleted by hand is
made again, complete (there is nothing to copy).
"""

from __future__ import annotations

import logging
from typing import Any

import sqlalchemy as sa

from relay.constants import SENT_LOG_REBUILD_ENTRIES
from relay.db.dialects import of
from relay.db.engine import create_engine, db_errors
from relay.db.schema import SENT_LOG, outbox_sent, outbox_sent_journal, outbox_sent_state
from relay.redact import redact_url

log = logging.getLogger(__name__)

_STATE = outbox_sent_state
_JOURNAL = outbox_sent_journal
_ENTRY = ("key", "id", "created_at", "sent_at")


def complete() -> sa.ColumnElement[bool]:
    """The sent log is whole: a claim's condition (one read of a one-row table)."""
    return sa.exists().where(_STATE.c.log == SENT_LOG, _STATE.c.complete)


def journaled(logged: sa.CTE) -> sa.Insert:
    """The journal row of the entries an ack logged (``logged``: their ``key``, ``id``,
    ``created_at``, ``sent_at``; none, no row): one row per ack statement, in time order."""
    arrays = (logged.c.key, logged.c.id, logged.c.created_at)
    entries = (
        sa.select(
            sa.func.max(logged.c.sent_at),
            sa.func.min(logged.c.id),
            *(sa.func.array_agg(column) for column in arrays),
        )
        .select_from(logged)
        .having(sa.func.count() > 0)
    )
    return sa.insert(_JOURNAL).from_select(
        ["sent_at", "id", "message_keys", "ids", "created_at"], entries
    )


def purge_journal(cutoff: sa.ColumnElement[Any], chunk: int) -> sa.Delete:
    """At most ``chunk`` of the journal's rows of entries sent before ``cutoff``, oldest
    first: their entries have left the log (``relay.db.outbox.OutboxAdmin.purge``)."""
    old = (
        sa.select(_JOURNAL.c.sent_at, _JOURNAL.c.id)
        .where(_JOURNAL.c.sent_at < cutoff)
        .order_by(_JOURNAL.c.sent_at, _JOURNAL.c.id)
        .limit(chunk)
    )
    return sa.delete(_JOURNAL).where(sa.tuple_(_JOURNAL.c.sent_at, _JOURNAL.c.id).in_(old))


class SentLogRebuild:
    """A relay's side of the sent log's completeness: whether it is complete, and the next
    slice of its rebuild. In the relay's bounded sessions."""

    def __init__(self, url: str, slice_entries: int = SENT_LOG_REBUILD_ENTRIES) -> None:
        """``slice_entries``: about how many entries a slice copies."""
        self.engine = create_engine(url, relay_session=True)
        self._slice_entries = slice_entries
        self._where = redact_url(url)
        dialect = of(self.engine)
        self._journaled = dialect.journals_sent_log
        self._made = dialect.insert_or_ignore(_STATE).values(log=SENT_LOG, complete=False)
        self._copies = {
            after: _copy_slice(dialect.insert_or_ignore(outbox_sent), after)
            for after in (False, True)
        }
        # Journal rows per slice, adapted to hold about ``slice_entries`` entries (an ack
        # statement's row holds one to a thousand).
        self._rows = max(1, slice_entries // 100)

    def complete(self) -> bool:
        with db_errors("sent log", self._where), self.engine.connect() as conn:
            return bool(conn.execute(sa.select(complete())).scalar())

    def step(self) -> int | None:
        """Copy the journal's next slice into the log, in one transaction, and mark the log
        complete after the last. Returns the entries copied (0 while another relay copies a
        slice), or None once the log is complete."""
        with db_errors("sent log", self._where), self.engine.begin() as conn:
            conn.execute(self._made)
            state = conn.execute(
                sa.select(_STATE.c.complete, _STATE.c.rebuilt_at, _STATE.c.rebuilt_id)
                .where(_STATE.c.log == SENT_LOG)
                .with_for_update(skip_locked=True)
            ).one_or_none()
            if state is None:
                return 0  # another relay holds the row: it is copying a slice
            if state.complete:
                return None
            last = None
            if self._journaled:
                after = state.rebuilt_at is not None
                params = {
                    "rows": self._rows,
                    "entries": self._slice_entries,
                    "after_at": state.rebuilt_at,
                    "after_id": state.rebuilt_id,
                }
                last = conn.execute(self._copies[after], params).one_or_none()
            mark = sa.update(_STATE).where(_STATE.c.log == SENT_LOG)
            if last is None or last.rows == last.read < self._rows:  # the journal's last slice
                conn.execute(mark.values(complete=True, rebuilt_at=None, rebuilt_id=None))
            else:
                conn.execute(mark.values(rebuilt_at=last.sent_at, rebuilt_id=last.id))
        if last is None:
            return None
        # Rows to read for the next slice: about ``slice_entries`` entries' worth.
        per_row = max(1, int(last.entries) // int(last.rows))
        self._rows = max(1, min(2 * self._rows, self._slice_entries // per_row))
        return int(last.entries)

    def close(self) -> None:
        self.engine.dispose()


def _copy_slice(insert: sa.Insert, after: bool) -> sa.Select[Any]:
    """The journal's next rows (with ``after``: those after ``after_at``, ``after_id``) copied
    into the log by ``insert`` (an INSERT of the log that skips a key already there): of the
    next ``rows`` rows read, those whose entries add up to at most ``entries`` (the first
    whatever its size), so that no slice outgrows a statement's time. Its one row: the last
    copied row's place, the rows read and copied, the entries copied. No row once the journal
    is copied."""
    place = (_JOURNAL.c.sent_at, _JOURNAL.c.id)
    rows = sa.select(_JOURNAL).order_by(*place).limit(sa.bindparam("rows"))
    if after:
        at = sa.bindparam("after_at", type_=_JOURNAL.c.sent_at.type)
        id_ = sa.bindparam("after_id", type_=sa.BigInteger())
        rows = rows.where(sa.tuple_(*place) > sa.tuple_(at, id_))
    read = rows.subquery("read")
    size = sa.func.cardinality(read.c.message_keys)
    counted = sa.select(
        read,
        sa.func.sum(size).over(order_by=(read.c.sent_at, read.c.id)).label("upto"),
        sa.func.count().over().label("read"),
    ).subquery("counted")
    chunk = (
        sa.select(counted)
        .where(
            counted.c.upto - sa.func.cardinality(counted.c.message_keys) < sa.bindparam("entries")
        )
        .cte("chunk")
    )
    entry = (
        sa.func.unnest(chunk.c.message_keys, chunk.c.ids, chunk.c.created_at)
        .table_valued("key", "id", "created_at")
        .render_derived("entry")
    )
    entries = sa.select(entry.c.key, entry.c.id, entry.c.created_at, chunk.c.sent_at).select_from(
        chunk.join(entry, sa.true())
    )
    copied = insert.from_select(list(_ENTRY), entries).cte("copied")
    return (
        sa.select(
            chunk.c.sent_at,
            chunk.c.id,
            chunk.c.read,
            sa.func.count().over().label("rows"),
            sa.func.sum(sa.func.cardinality(chunk.c.message_keys)).over().label("entries"),
        )
        .order_by(chunk.c.sent_at.desc(), chunk.c.id.desc())
        .limit(1)
        .add_cte(copied)
    )
