"""The sent log's completeness, its journal, and its rebuild from the journal.

Where the database journals the sent log (PostgreSQL: ``Dialect.journals_sent_log``,
``relay.db.schema.outbox_sent_journal`` says why), the log is UNLOGGED: a crash of the server,
or a failover to a standby, empties it and its state row. A claim takes no row while the state
row does not say the log is complete (``complete``): it could not tell a message id sent
before from a new one. A relay that finds it so rebuilds the log from the journal
(``SentLogRebuild``) in one statement, in the log's key order: each entry then goes to the
key index's right edge, the index built as a sort builds it, which is what makes a rebuild
of 60 million entries minutes, not the better part of an hour as in the journal's time
order. The relay holds the state row's lock meanwhile, so that relays never rebuild at once;
one that stops half-way rolls back, and the next starts again. Acks go on meanwhile and log
their entries in both; an entry the rebuild copies again is written once (the log's key is
unique).

The journal also answers what the log's sent times answered elsewhere (``entries``): the
journaled log keeps its key index alone, since a second index, in time order, made each
rebuilt entry a random insert again (a rebuild four times as long).

Elsewhere the log is never emptied behind the relays' backs; a state row deleted by hand is
made again, complete (there is nothing to copy).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from relay.constants import SENT_TAIL_LOOKUP_MAX_S
from relay.db.clock import database_time
from relay.db.dialects import of
from relay.db.engine import create_engine, db_errors
from relay.db.schema import (
    SENT_LOG,
    outbox_sent,
    outbox_sent_journal,
    outbox_sent_legacy,
    outbox_sent_runs,
    outbox_sent_state,
)
from relay.redact import redact_url
from relay.sentlog import SentLogState

log = logging.getLogger(__name__)

_STATE = outbox_sent_state
_JOURNAL = outbox_sent_journal
_ENTRY = ("key", "id", "created_at", "sent_at")


def complete() -> sa.ColumnElement[bool]:
    """The sent log is whole: the purge's condition (one read of a one-row table)."""
    return sa.exists().where(_STATE.c.log == SENT_LOG, _STATE.c.complete)


def claimable(journaled: bool) -> sa.ColumnElement[bool]:
    """A claim's condition: the log is whole, or holds the journal's tail while the runs
    answer for the rest (``recovering``, ``relay.db.sentruns``); or, where the log is
    journaled, a run bounds the journal's tail to at most ``SENT_TAIL_LOOKUP_MAX_S`` of
    acks: the claim leaves each row's dedupe unknown and the relay looks its id up in the
    runs and that tail itself (``relay.db.sentruns.tail_sent``) while the tail is copied
    back. The tail's span is from the latest run's end to its last entry, not to now: a
    server restored from a backup hours old has a tail of the minutes before the backup
    (an outside review's restore waited for its copy). Without a run, or with the seals
    far behind, the tail is too long to pass over a claim at a time: claims wait for its
    copy. The look past the span is one probe of the journal's time-ordered key."""
    state = sa.exists().where(
        _STATE.c.log == SENT_LOG, sa.or_(_STATE.c.complete, _STATE.c.recovering)
    )
    if not journaled:
        return state
    unsealed = first_unsealed()
    span: sa.ColumnElement[Any] = sa.literal_column(
        f"interval '{SENT_TAIL_LOOKUP_MAX_S:g} seconds'"
    )
    past_the_span = sa.exists().where(_JOURNAL.c.sent_at >= unsealed + span)
    return sa.or_(state, sa.and_(unsealed.is_not(None), ~past_the_span))


def recovering() -> sa.ColumnElement[bool]:
    """Claims look their keys up in the runs too (the log holds the journal's tail only)."""
    return sa.exists().where(_STATE.c.log == SENT_LOG, _STATE.c.recovering)


def first_unsealed() -> sa.ScalarSelect[Any]:
    """Where the journal's tail begins: the sent time no run holds entries from on (the
    latest run's end), or None when there is no run (the whole journal is the tail)."""
    return sa.select(sa.func.max(outbox_sent_runs.c.upto)).scalar_subquery()


def entries(journaled: bool) -> sa.FromClause:
    """The logs' entries as a table of ``key``, ``id``, ``created_at`` and ``sent_at``, for
    reads by sent time (``relay status``, the console, a replay's count): with ``journaled``,
    the journal's, found by its time-ordered key (the log has no time index there), else the
    log's; and those of the log of the releases before (``outbox_sent_legacy``), by its own
    time index."""
    legacy = sa.select(*(outbox_sent_legacy.c[name] for name in _ENTRY))
    if not journaled:
        logged = sa.select(*(outbox_sent.c[name] for name in _ENTRY))
    else:
        entry = unnested(_JOURNAL)
        logged = sa.select(
            entry.c.key, entry.c.id, entry.c.created_at, _JOURNAL.c.sent_at
        ).select_from(_JOURNAL.join(entry, sa.true()))
    return sa.union_all(logged, legacy).subquery("sent_entries")


def journal_time() -> sa.ColumnElement[Any]:
    """An ack's sent time where the log is journaled: the database's clock, but never
    before the latest run's end (``relay.db.sentruns``). The tail copied back after a crash
    is the journal from that end on: an entry journaled before it would be in no run and no
    tail, forgotten while the log is recovering. A database whose clock went back (a
    failover to a standby whose clock is behind, a step of NTP) would journal such entries:
    they are sent at the runs' end instead, until the clock has caught up (an outside
    review: 100 of 100 ids acked after such a failover published again after the next
    crash)."""
    return sa.func.greatest(database_time(), first_unsealed())


def journaled(logged: sa.CTE) -> sa.Insert:
    """The journal row of the entries an ack logged (``logged``: their ``key``, ``id``,
    ``created_at``, ``sent_at``; none, no row): one row per ack statement, in time order."""
    arrays = (logged.c.key, logged.c.id, logged.c.created_at)
    rows = (
        sa.select(
            sa.func.max(logged.c.sent_at),
            sa.func.min(logged.c.id),
            *(sa.func.array_agg(column) for column in arrays),
        )
        .select_from(logged)
        .having(sa.func.count() > 0)
    )
    return sa.insert(_JOURNAL).from_select(
        ["sent_at", "id", "message_keys", "ids", "created_at"], rows
    )


def purge_chunk(cutoff: sa.ColumnElement[Any], chunk: int) -> Callable[[sa.Connection], int]:
    """One transaction's purge of the journal's oldest rows of entries sent before
    ``cutoff``, about ``chunk`` entries, with their entries in the log
    (``relay.db.outbox.OutboxAdmin.purge``): the entries purged, fewer than ``chunk`` only
    once none is left.

    None unless the log is complete, and that is held until the transaction ends (the state
    row's share lock): a rebuild copies the journal as it was when its statement began, so
    one that began as a purge deleted a row would bring its entries back as log entries no
    journal row holds, which no purge would ever find (kept for ever). A rebuild, or a state
    row deleted or updated by hand, waits for the chunk; a chunk that finds the rebuild
    holding the row purges nothing (the log is incomplete), and says so.

    Committed durably, though in a relay session: seen before it is flushed, a purge lets a
    claim take a re-written id as new and publish it, and a crash then undoes the purge; the
    rebuild brings the old entry back, the new publication's ack finds its key logged and
    journals nothing, and the next purge deletes the only entry of an id acked minutes
    before."""
    whole = (
        sa.select(_STATE.c.complete)
        .where(_STATE.c.log == SENT_LOG)
        .with_for_update(read=True, skip_locked=True)
    )
    purge = _purge_journaled(cutoff, chunk)

    def one_chunk(conn: sa.Connection) -> int:
        if not conn.execute(whole).scalar():
            log.warning(
                "the sent log is not complete (being rebuilt): its entries are purged once it is",
                extra={"action": "purge_waits"},
            )
            return 0
        of(conn).durable_commit(conn)
        return int(conn.execute(purge).scalar_one())

    return one_chunk


def _purge_journaled(cutoff: sa.ColumnElement[Any], chunk: int) -> sa.Select[Any]:
    """The statement of ``purge_chunk``: the journal's oldest rows, about ``chunk`` entries
    (the first row whatever its size, then rows while they add up to fewer), deleted with
    their entries in the log, found by their keys. Its one value: the entries purged."""
    place = (_JOURNAL.c.sent_at, _JOURNAL.c.id)
    oldest = sa.select(*place, _JOURNAL.c.ids).where(_JOURNAL.c.sent_at < cutoff).order_by(*place)
    read = oldest.limit(chunk).subquery("read")
    size = sa.func.cardinality(read.c.ids)
    upto = sa.func.sum(size).over(order_by=(read.c.sent_at, read.c.id))
    counted = sa.select(read.c.sent_at, read.c.id, (upto - size).label("before")).subquery()
    chosen = sa.select(counted.c.sent_at, counted.c.id).where(counted.c.before < chunk)
    old = (
        sa.delete(_JOURNAL)
        .where(sa.tuple_(*place).in_(chosen))
        .returning(_JOURNAL.c.message_keys, _JOURNAL.c.ids)
        .cte("old")
    )
    entry = unnested(old, ("key", "id"))
    gone = (
        sa.select(entry.c.key, entry.c.id).select_from(old.join(entry, sa.true())).subquery("gone")
    )
    in_log = sa.delete(outbox_sent).where(
        outbox_sent.c.key == gone.c.key, outbox_sent.c.id == gone.c.id
    )
    total = sa.func.coalesce(sa.func.sum(sa.func.cardinality(old.c.ids)), 0)
    return sa.select(total).add_cte(in_log.cte("in_log"))


class SentLogRebuild:
    """A relay's side of the sent log's completeness: what the state row says, and the log's
    recovery and rebuild. In the relay's bounded sessions, but for the copies, which take as
    long as the journal's entries need (``Dialect.unbounded``)."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url, relay_session=True)
        self._where = redact_url(url)
        self._dialect = of(self.engine)
        self._made = self._dialect.insert_or_ignore(_STATE).values(
            log=SENT_LOG, complete=False, recovering=False
        )
        # Run only where the log is journaled (``unnest`` is PostgreSQL's). Their count is
        # the statement's one row: the driver's row count of an INSERT from a SELECT is -1.
        self._copy_tail, self._copy_all = (
            sa.select(sa.func.count()).select_from(
                self._dialect.insert_or_ignore(outbox_sent)
                .from_select(list(_ENTRY), _in_key_order(tail))
                .returning(outbox_sent.c.key)
                .cte("copied")
            )
            for tail in (True, False)
        )
        self._running: Any = None  # the driver's connection while a copy runs
        self._lock = threading.Lock()

    def state(self) -> SentLogState:
        with db_errors("sent log", self._where), self.engine.connect() as conn:
            row = conn.execute(
                sa.select(_STATE.c.complete, _STATE.c.recovering).where(_STATE.c.log == SENT_LOG)
            ).one_or_none()
        if row is not None and row.complete:
            return SentLogState.COMPLETE
        if row is not None and row.recovering:
            return SentLogState.RECOVERING
        return SentLogState.INCOMPLETE

    def complete(self) -> bool:
        return self.state() is SentLogState.COMPLETE

    def recover(self) -> int | None:
        """Make the log good for claims: copy into it the journal's tail, the entries no run
        holds (``relay.db.sentruns``), and say it recovering; where the log is not
        journaled, say it complete (there is nothing to copy). The entries copied; None,
        without waiting, while another relay holds the state row: look again later."""
        return self._copied(self._copy_tail, recovering=True)

    def rebuild(self) -> int | None:
        """Copy the whole journal into the log, in one transaction, and mark the log
        complete: the entries copied (none if another relay just did). None, without
        waiting, while another relay holds the state row: look again later."""
        return self._copied(self._copy_all, recovering=False)

    def _copied(self, copy: sa.Select[Any], *, recovering: bool) -> int | None:
        with db_errors("sent log", self._where), self.engine.begin() as conn:
            # Made in a transaction of its own: a relay's row, uncommitted while it copies,
            # would hold the others' inserts for as long (lock timeouts every few seconds).
            conn.execute(self._made)
        with db_errors("sent log", self._where), self.engine.begin() as conn:
            state = conn.execute(
                sa.select(_STATE.c.complete, _STATE.c.recovering)
                .where(_STATE.c.log == SENT_LOG)
                .with_for_update(skip_locked=True)
            ).one_or_none()
            if state is None:
                return None
            if state.complete or (recovering and state.recovering):
                return 0
            copied = 0
            if self._dialect.journals_sent_log:
                self._dialect.unbounded(conn)
                with self._lock:
                    self._running = conn.connection.driver_connection
                try:
                    copied = int(conn.execute(copy).scalar_one())
                finally:
                    with self._lock:
                        self._running = None
            done = (
                {"recovering": True}
                if recovering and self._dialect.journals_sent_log
                else {
                    "complete": True,
                    "recovering": False,
                }
            )
            conn.execute(sa.update(_STATE).where(_STATE.c.log == SENT_LOG).values(**done))
        return copied

    def cancel(self) -> None:
        """Cancel a copy under way (the relay is stopping): it rolls back, and the next
        relay to look starts it again. From another thread."""
        with self._lock:
            if self._running is not None:
                self._dialect.cancel(self._running)

    def close(self) -> None:
        self.engine.dispose()


def unnested(rows: sa.FromClause, columns: tuple[str, ...] = ("key", "id", "created_at")) -> Any:
    """The entries of ``rows``' journal rows: their arrays side by side, one row each."""
    arrays = {"key": "message_keys", "id": "ids", "created_at": "created_at"}
    return (
        sa.func.unnest(*(rows.c[arrays[name]] for name in columns))
        .table_valued(*columns)
        .render_derived("entry")
    )


def _in_key_order(tail: bool) -> sa.Select[Any]:
    """Every entry of the journal (with ``tail``, those no run holds: sent at or after the
    latest run's end), in the log's key order; of a key journaled twice (sent again past
    the horizon, before the purge reached its first entry), the latest first, so that the
    log keeps the entry the purge leaves longest."""
    entry = unnested(_JOURNAL)
    entries = (
        sa.select(entry.c.key, entry.c.id, entry.c.created_at, _JOURNAL.c.sent_at)
        .select_from(_JOURNAL.join(entry, sa.true()))
        .order_by(entry.c.key, _JOURNAL.c.sent_at.desc())
    )
    if tail:
        unsealed = first_unsealed()
        entries = entries.where(sa.or_(unsealed.is_(None), _JOURNAL.c.sent_at >= unsealed))
    return entries
