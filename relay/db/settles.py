"""What a settle writes: acked rows sent, duplicates dropped, the other outcomes' row changes.

One ``Settles`` per relay builds its statements once (for its database, its name and what it
keeps of an acked row) and writes a ``SettleBatch`` with them in one transaction.

A row is found by its id and, where a database can hand an id out again, its message id: after
a failover to an asynchronous standby or a restore to a point in time, the database has lost
the last rows written and the sequence's advance with them, and hands their ids to new rows;
a relay that held an ack of a lost row, retried across the failover, deleted the new row as
sent, and it was never published (an outside review: 140 to 361 rows a failover).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa

from relay.causes import stored_cause
from relay.constants import IDS_PER_STATEMENT, LAST_ERROR_MAX_CHARS
from relay.db.buckets import owned_by
from relay.db.clock import database_time
from relay.db.columns import sent_key
from relay.db.dialects import of
from relay.db.schema import DUPLICATES, bucket_column, outbox, outbox_counters, outbox_sent
from relay.db.sentlog import journal_time, journaled
from relay.records import KEEP_MESSAGES, PARKED, SENT, SettleBatch

# "The row is still pending" for the settle, which finds its rows by primary key: said so that
# the planner cannot prove ``status = 'pending'`` and so cannot pick the partial due index for
# it. Right after a bulk load, with statistics saying "few pending rows", it scanned every
# pending row in outbox_due_idx instead of looking up 500 ids (EXPLAIN ANALYZE in bench.run:
# 523 ms per settle, 96,500 index entries read and dropped). The check constraint allows
# these three statuses only, so the meaning is the same.
_STILL_PENDING = sa.and_(outbox.c.status != SENT, outbox.c.status != PARKED)


class Settles:
    """The settle statements of the relay ``owner`` on ``dialect``."""

    def __init__(self, dialect: sa.Dialect, owner: str, keep_sent: str) -> None:
        self._dialect = of(dialect)
        # The rows bound as ``ids`` that are still pending: what an ack and a duplicate's drop
        # may change.
        self._pending_ids = sa.and_(
            self._dialect.id_in(outbox.c.id), self._same_messages(), _STILL_PENDING
        )
        self._acked = self._ack_statements(keep_sent)
        self._drop = sa.delete(outbox).where(self._pending_ids)
        self._count_dropped = (
            sa.update(outbox_counters)
            .where(outbox_counters.c.name == DUPLICATES)
            .values(value=outbox_counters.c.value + sa.bindparam("dropped", type_=sa.BigInteger()))
        )
        # A failure is written only while the row's bucket is still ours: if another relay
        # took it, that relay may hold the row now, and its outcome decides. A lease that
        # ran out with the bucket taken by no one still leaves the row ours: dropping the
        # failure would hand a poison row its attempt back after every slow turn. An ack
        # is written regardless: it proves delivery whoever holds the row.
        change = self._dialect.changes_table()
        self._changed = (
            sa.update(outbox)
            .where(
                outbox.c.id == change.c.id,
                self._same_messages(),
                _STILL_PENDING,
                self._dialect.in_once(bucket_column(outbox.c.id), owned_by(owner)),
            )
            .values(
                status=change.c.status,
                attempts=change.c.attempts,
                next_attempt_at=database_time(change.c.delay),
                last_error=change.c.last_error,
                cause=change.c.cause,
                suspect=change.c.suspect,
            )
        )

    def statements(self, batch: SettleBatch) -> int:
        """How many statements ``write`` runs for ``batch``."""
        acks = -(-len(batch.sent) // IDS_PER_STATEMENT) * len(self._acked)
        drops = -(-len(batch.duplicates) // IDS_PER_STATEMENT)
        return acks + bool(batch.changes) + (drops + 1 if batch.duplicates else 0)

    def _same_messages(self) -> sa.ColumnElement[bool]:
        """The rows whose message id is one bound as ``message_ids`` (the rows claimed), where
        the database may hand a row's id to another (``Dialect.reuses_ids``)."""
        if not self._dialect.reuses_ids:
            return sa.true()
        return self._dialect.in_list(outbox.c.message_id, "message_ids", outbox.c.message_id.type)

    def write(
        self, conn: sa.Connection, batch: SettleBatch, message_ids: Mapping[int, Any]
    ) -> None:
        """Write ``batch`` on ``conn`` (in one transaction, the caller's); ``message_ids``: the
        message id each of its rows had when claimed."""

        def bound(ids: list[int]) -> dict[str, list[Any]]:
            return {"ids": ids, "message_ids": [message_ids.get(i) for i in ids]}

        for ids in _chunks(batch.sent):
            for statement in self._acked:
                conn.execute(statement, bound(ids))
        # A duplicate leaves whoever holds it: its message was delivered (the sent log says
        # so), and its first entry there stays. Counted as dropped, for ``relay status``,
        # only where this statement deleted it (two relays, one count).
        dropped = sum(
            conn.execute(self._drop, bound(ids)).rowcount for ids in _chunks(batch.duplicates)
        )
        if dropped:
            conn.execute(self._count_dropped, {"dropped": dropped})
        if batch.changes:
            changes = [
                (
                    c.id,
                    c.status,
                    c.attempts,
                    c.delay,
                    c.last_error[:LAST_ERROR_MAX_CHARS],
                    # Only a parked row's: a row retried and then parked by a relay of
                    # the release before (which writes no cause) kept this one's, and
                    # was counted and changed as of a cause not its error's (an outside
                    # review).
                    stored_cause(c.last_error[:LAST_ERROR_MAX_CHARS])
                    if c.status == PARKED
                    else None,
                    c.suspect,
                )
                for c in batch.changes
            ]
            parameters = dict(self._dialect.changes_parameters(changes))
            parameters["message_ids"] = [message_ids.get(c.id) for c in batch.changes]
            conn.execute(self._changed, parameters)

    def _ack_statements(self, keep_sent: str) -> list[sa.Executable]:
        """What an ack writes, for the ids bound as ``ids``, in order.

        ``keep_sent = messages``: the row is marked sent. ``ids``: the row is deleted and its
        message id's key, id and times go to the sent log.

        Where the log is journaled (PostgreSQL, ``relay.db.sentlog``): one statement (a
        data-modifying CTE) deletes the rows, logs their keys and writes what it logged to the
        journal, one row. A key already logged takes the ack's entry (``ON CONFLICT DO
        UPDATE``), journaled with the others: a claim published the id because the log did
        not have it, so the entry there is an older one a crash or a failover brought back
        with the purge that had removed it undone; kept, it would go at the next purge, and
        the id acked now with it. On the unlogged log the speculative insertion writes no WAL
        (on the logged log of the releases before, its confirmation records were 48 of the
        552 bytes of WAL an acked row cost, and a probe of the key replaced it). Elsewhere: two
        statements of one transaction, and a key already logged (a message sent again) keeps
        its first entry."""
        pending = self._pending_ids
        if keep_sent == KEEP_MESSAGES:
            mark = sa.update(outbox).where(pending)
            return [mark.values(status=SENT, sent_at=database_time())]
        columns = ["key", "id", "created_at", "sent_at"]
        if self._dialect.journals_sent_log:
            gone = (
                sa.delete(outbox)
                .where(pending)
                .returning(outbox.c.message_id, outbox.c.id, outbox.c.created_at)
                .cte("gone")
            )
            entries = sa.select(
                sent_key(gone.c.message_id), gone.c.id, gone.c.created_at, journal_time()
            )
            new = (
                self._dialect.insert_or_replace(outbox_sent, outbox_sent.c.key)
                .from_select(columns, entries)
                .returning(*(outbox_sent.c[c] for c in columns))
                .cte("logged")
            )
            return [journaled(new)]
        logged = sa.select(
            sent_key(outbox.c.message_id), outbox.c.id, outbox.c.created_at, database_time()
        ).where(pending)
        # On MySQL IGNORE, not ON DUPLICATE KEY UPDATE, which needs UPDATE on the log (the
        # relay role has none); none of these values can be too long for its column (a
        # 16-byte key, an id, two times).
        log_once = self._dialect.insert_or_ignore(outbox_sent).from_select(columns, logged)
        return [log_once, sa.delete(outbox).where(pending)]


def _chunks(ids: tuple[int, ...]) -> list[list[int]]:
    return [list(ids[i : i + IDS_PER_STATEMENT]) for i in range(0, len(ids), IDS_PER_STATEMENT)]
