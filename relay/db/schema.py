"""The outbox table: the one definition used by Alembic, the relay and the Spark writer.

Times are stored in UTC. Headers are JSON *text* (not a JSON column) so that any writer,
including Spark's JDBC writer which binds strings, can insert them on every database; the
relay parses them and parks a row whose headers are not a JSON object.

The columns' types, each database's own, are ``relay.db.columns``'s. MySQL and MariaDB
(dialect ``mysql``) have no partial indexes: each of the outbox's indexes there starts with
the status instead, which keeps the claim's walk to the pending rows.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from relay.constants import (
    BUCKET_SPAN_ROWS,
    BUCKET_STRIDE,
    CONSOLE_REASON_PREFIX,
    OUTBOX_BUCKETS,
)
from relay.db.columns import (
    LONG_TEXT,
    PAYLOAD,
    ROW_ID,
    SENT_KEY,
    SHORT_TEXT,
    STATUS_TEXT,
    UTCDateTime,
    new_message_id,
    stored_now,
)
from relay.db.dialects import of
from relay.records import PARKED, PENDING, SENT, STATUSES

metadata = sa.MetaData()


# Partial indexes MySQL does without (``_partial_index``): there every row pays for every
# index, at insert and at delete, and the due index, led by the status, serves their few
# reads. The parked rows are a range of it (status 'parked'); ``relay status``'s list of
# retrying rows walks its pending range, and a hastened exchange's rows are its pending rows
# due later. Each index less cut MariaDB's CPU per relayed row by about 2.5 us (of 32).
MYSQL_SKIPPED_INDEXES = ("outbox_parked_idx", "outbox_retrying_idx")


def index_columns(dialect: sa.Dialect, columns: list[str]) -> list[str]:
    """A partial index's columns as created on ``dialect``: led by the status on MySQL,
    which has no partial indexes (see the module docstring)."""
    return of(dialect).index_columns(columns)


outbox = sa.Table(
    "outbox",
    metadata,
    sa.Column("id", ROW_ID, primary_key=True),
    sa.Column(
        "message_id",
        SHORT_TEXT.with_variant(sa.Text(collation="C"), "postgresql"),
        nullable=False,
        server_default=new_message_id(),
    ),
    sa.Column("exchange", SHORT_TEXT, nullable=False, server_default=""),
    sa.Column("routing_key", SHORT_TEXT, nullable=False, server_default=""),
    sa.Column("payload", PAYLOAD, nullable=False),
    sa.Column(
        "content_type", SHORT_TEXT, nullable=False, server_default="application/octet-stream"
    ),
    sa.Column("headers", LONG_TEXT, nullable=True),
    # Rows with the same ordering key are published in id order when ordering is on.
    sa.Column("ordering_key", SHORT_TEXT, nullable=True),
    sa.Column("created_at", UTCDateTime(), nullable=False, server_default=stored_now()),
    sa.Column("next_attempt_at", UTCDateTime(), nullable=False, server_default=stored_now()),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.Column("status", STATUS_TEXT, nullable=False, server_default=PENDING),
    sa.Column("sent_at", UTCDateTime(), nullable=True),
    sa.Column("last_error", sa.Text(), nullable=True),
    # ``relay.records.OutboxRow.suspect``: its own column, not a word in last_error (which is
    # for operators, and which ``relay replay --reason`` selects by).
    sa.Column("suspect", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.CheckConstraint(
        "status IN (" + ", ".join(f"'{s}'" for s in STATUSES) + ")", name="outbox_status_valid"
    ),
    sa.UniqueConstraint("message_id", name="outbox_message_id_key"),
    # SQLite: an id is never given again, even after the highest row was deleted (migration
    # 0008 says why). PostgreSQL's sequence and InnoDB's counter never go back.
    sqlite_autoincrement=True,
)


def _has_partial_indexes(*_args: Any, dialect: sa.Dialect, **_kw: Any) -> bool:
    return of(dialect).partial_indexes


def _partial_index(name: str, *columns: sa.Column[Any], where: sa.ColumnElement[bool]) -> None:
    """An index of the outbox's rows that match ``where`` only; on MySQL, of every row, led
    by the status (``index_columns``), or none (``MYSQL_SKIPPED_INDEXES``)."""
    partial = sa.Index(name, *columns, postgresql_where=where, sqlite_where=where)
    partial.ddl_if(callable_=_has_partial_indexes)
    if name not in MYSQL_SKIPPED_INDEXES:
        sa.Index(name, outbox.c.status, *columns).ddl_if(dialect="mysql")


# "Find due rows" reads only pending rows, which stay few while sent rows pile up: a partial
# index keeps the claim query's cost independent of the table's history.
_partial_index(
    "outbox_due_idx",
    outbox.c.next_attempt_at,
    outbox.c.id,
    where=outbox.c.status == PENDING,
)

# The ordered claim asks "is an earlier row of this key still pending?" for each candidate.
_partial_index(
    "outbox_ordering_idx",
    outbox.c.ordering_key,
    outbox.c.id,
    where=sa.and_(outbox.c.status == PENDING, outbox.c.ordering_key.is_not(None)),
)

# ``relay status`` counts parked rows, and ``relay replay`` finds them, without reading the
# pending ones; the index has no entry for any other row, so it costs the relay nothing.
_partial_index(
    "outbox_parked_idx",
    outbox.c.id,
    where=outbox.c.status == PARKED,
)

# Pending rows that failed before: ``relay status`` lists them by exchange, and a destination
# found again hastens them. Only a failed attempt (an update that moves the row in the due
# index anyway) adds an entry.
_partial_index(
    "outbox_retrying_idx",
    outbox.c.exchange,
    where=sa.and_(outbox.c.status == PENDING, outbox.c.attempts > 0),
)

# Sent rows kept whole (``keep_sent = messages``): ``relay status``, the purge and replay by
# time find them by their sent time. Empty when acked rows leave the outbox.
_partial_index(
    "outbox_sent_idx",
    outbox.c.sent_at,
    where=outbox.c.status == SENT,
)


# The operator console (``relay.db.console``) lists parked rows most recently parked first
# (a parked row's ``next_attempt_at`` is when it was parked), by cause and by exchange, a
# page at a time. Partial: a writer's INSERT (a pending row) adds no entry to any of them,
# only a row being parked does. Not on MySQL (no partial indexes): there every writer's
# INSERT would pay for them, and the console reads its pages by walking the parked range
# of the due index instead.
def reason_prefix(column: sa.ColumnElement[str | None]) -> sa.ColumnElement[str]:
    """The first ``CONSOLE_REASON_PREFIX`` characters of a last error, as the console's index
    holds them (a B-tree entry must stay small; an error may be long). Its numbers are
    literals, so that a query's expression is the index's."""
    return sa.func.substr(
        column, sa.literal_column("1"), sa.literal_column(str(CONSOLE_REASON_PREFIX))
    )


CONSOLE_INDEXES = (
    ("outbox_parked_time_idx", outbox.c.next_attempt_at, outbox.c.id),
    (
        "outbox_parked_reason_idx",
        reason_prefix(outbox.c.last_error),
        outbox.c.next_attempt_at,
        outbox.c.id,
    ),
    ("outbox_parked_exchange_idx", outbox.c.exchange, outbox.c.next_attempt_at, outbox.c.id),
)
for _name, *_columns in CONSOLE_INDEXES:
    _parked = outbox.c.status == PARKED
    sa.Index(_name, *_columns, postgresql_where=_parked, sqlite_where=_parked).ddl_if(
        callable_=_has_partial_indexes
    )

# The sent log: what is left of an acked row when acked rows leave the outbox (the default,
# ``keep_sent = ids``). Its keys keep message ids unique beyond the outbox for the dedupe
# horizon (the retention): a relay's claim probes it for every row it claims and drops,
# unpublished, a row whose message id is here (``relay.db.claims``), whoever the writer
# was. Its times serve ``relay status`` (sent counts, latency) and the purge.
outbox_sent = sa.Table(
    "outbox_sent",
    metadata,
    sa.Column("key", SENT_KEY, primary_key=True),
    sa.Column("id", ROW_ID, nullable=False),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("sent_at", UTCDateTime(), nullable=False),
)

# The purge and ``relay status`` find entries by their sent time. A B-tree: a BRIN index
# assumed the log's physical order was its time order, which the purge undoes (migration
# 0008). New entries go to its right edge.
sa.Index("outbox_sent_time_idx", outbox_sent.c.sent_at)

# Owned buckets (``relay.buckets``): the relays alive, each until its presence runs out, and
# which relay owns each bucket of the outbox until when. Both tables stay tiny (a row per
# relay, a row per bucket), so rewriting their rows every few seconds costs nothing beside
# the outbox.
outbox_relays = sa.Table(
    "outbox_relays",
    metadata,
    sa.Column("owner", SHORT_TEXT, primary_key=True),
    sa.Column("alive_until", UTCDateTime(), nullable=False),
    # ``relay.buckets.fence``; NULL: a relay of a release before protocols (migration 0012).
    sa.Column("protocol", sa.SmallInteger(), nullable=True),
)
outbox_buckets = sa.Table(
    "outbox_buckets",
    metadata,
    sa.Column("bucket", sa.SmallInteger(), primary_key=True, autoincrement=False),
    sa.Column("owner", SHORT_TEXT, nullable=True),
    sa.Column("lease_until", UTCDateTime(), nullable=True),
)
# The least protocol a relay must speak to claim (``relay.buckets.fence``), one row (migration
# 0013). A migration that relays of older protocols cannot run beside raises it, naming the
# release to run: those relays give their buckets up and stop.
outbox_protocol = sa.Table(
    "outbox_protocol",
    metadata,
    sa.Column("least_protocol", sa.SmallInteger(), primary_key=True, autoincrement=False),
    sa.Column("least_release", SHORT_TEXT, nullable=False),
)


# Running totals the relays keep for ``relay status``, a row each (``COUNTERS``), written
# only when they change: ``duplicates`` counts the rows dropped because their message id
# was in the sent log.
outbox_counters = sa.Table(
    "outbox_counters",
    metadata,
    sa.Column("name", SHORT_TEXT, primary_key=True),
    sa.Column("value", sa.BigInteger(), nullable=False, server_default=sa.text("0")),
)
DUPLICATES = "duplicates"
COUNTERS = (DUPLICATES,)


def bucket_column(row_id: sa.ColumnElement[int]) -> sa.ColumnElement[int]:
    """The bucket of a row, in SQL (``relay.buckets.bucket_of``): integer division on both
    databases."""
    return (row_id // BUCKET_SPAN_ROWS * BUCKET_STRIDE) % OUTBOX_BUCKETS


# What a claimed row carries to the publisher (``relay.records.OutboxRow``'s fields).
# The columns a writer fills (the Spark writer, ``relay enqueue``; a plain-SQL writer may also
# give ``created_at``); the database fills in the rest. A writer's role may insert these
# and no others (``relay.db.roles``): an id ahead of the sequence, or a row written as sent
# or with attempts spent, is not a writer's to make.
WRITTEN_COLUMNS = (
    "message_id",
    "exchange",
    "routing_key",
    "payload",
    "content_type",
    "headers",
    "ordering_key",
)
WRITER_COLUMNS = (*WRITTEN_COLUMNS, "created_at")

ROW_COLUMNS = (
    outbox.c.id,
    outbox.c.message_id,
    outbox.c.exchange,
    outbox.c.routing_key,
    outbox.c.payload,
    outbox.c.content_type,
    outbox.c.headers,
    outbox.c.created_at,
    outbox.c.attempts,
    outbox.c.last_error,
    outbox.c.suspect,
)


# The consumers' inbox (``relay.inbox``): a row per message a consumer processed, inserted
# first in the transaction of its handler, so that the key and the handler's writes commit or
# roll back together; a delivery whose key is here is a duplicate, acked unprocessed. The
# consumer's name is part of the key, so consumers of one database share the table.
# Message ids are AMQP short strings (at most 255 bytes); ``ce-id`` headers are checked to fit.
INBOX_KEY_TEXT = SHORT_TEXT.with_variant(sa.Text(collation="C"), "postgresql")
inbox_received = sa.Table(
    "inbox_received",
    metadata,
    sa.Column("consumer", INBOX_KEY_TEXT, primary_key=True),
    sa.Column("message_id", INBOX_KEY_TEXT, primary_key=True),
    sa.Column("received_at", UTCDateTime(), nullable=False, server_default=stored_now()),
)
# The purge finds keys older than the dedupe window by their time.
sa.Index("inbox_received_time_idx", inbox_received.c.received_at)

# Failed attempts at a message, counted in a short transaction of their own (the handler's
# rolled back): after the inbox's maximum the delivery is dead-lettered. A row is written
# only when a handler fails or a delivery comes again, and is purged with the keys.
# ``running``: a delivery that came again is in its handler; found still set by the next
# delivery, that run died inside the handler (a crash counts as a failure, and nothing else
# that returns a delivery does: migration 0011).
inbox_attempts = sa.Table(
    "inbox_attempts",
    metadata,
    sa.Column("consumer", INBOX_KEY_TEXT, primary_key=True),
    sa.Column("message_id", INBOX_KEY_TEXT, primary_key=True),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("last_error", sa.Text(), nullable=True),
    sa.Column("updated_at", UTCDateTime(), nullable=False, server_default=stored_now()),
    sa.Column("running", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("first_failed_at", UTCDateTime(), nullable=True),
)
sa.Index("inbox_attempts_time_idx", inbox_attempts.c.updated_at)


# The console's changes (``relay.db.console_actions``): who did what to which rows, written in
# the transaction of the change itself, never a payload. ``target`` is JSON: the ids, or the
# filter and the bound the operator saw.
console_audit = sa.Table(
    "console_audit",
    metadata,
    sa.Column("id", ROW_ID, primary_key=True),
    sa.Column("at", UTCDateTime(), nullable=False, server_default=stored_now()),
    sa.Column("actor", SHORT_TEXT, nullable=False),
    sa.Column("role", SHORT_TEXT, nullable=False),
    sa.Column("action", SHORT_TEXT, nullable=False),
    sa.Column("target", LONG_TEXT, nullable=False),
    sa.Column("rows", sa.Integer(), nullable=False, server_default=sa.text("0")),
    sa.Column("result", sa.Text(), nullable=False),
    sqlite_autoincrement=True,
)

# Parked rows the console discarded: moved out of the outbox whole (the relays never see
# them), restorable as they were. Their ids are the outbox's, never handed out again.
outbox_archive = sa.Table(
    "outbox_archive",
    metadata,
    sa.Column("id", ROW_ID, primary_key=True, autoincrement=False),
    sa.Column("message_id", SHORT_TEXT, nullable=False),
    sa.Column("exchange", SHORT_TEXT, nullable=False),
    sa.Column("routing_key", SHORT_TEXT, nullable=False),
    sa.Column("payload", PAYLOAD, nullable=False),
    sa.Column("content_type", SHORT_TEXT, nullable=False),
    sa.Column("headers", LONG_TEXT, nullable=True),
    sa.Column("ordering_key", SHORT_TEXT, nullable=True),
    sa.Column("created_at", UTCDateTime(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False),
    sa.Column("last_error", sa.Text(), nullable=True),
    sa.Column("archived_at", UTCDateTime(), nullable=False, server_default=stored_now()),
    sa.Column("archived_by", SHORT_TEXT, nullable=False),
)
sa.Index("outbox_archive_time_idx", outbox_archive.c.archived_at)

# An admin's edited copy of a parked row (a new row, a new id and message id), linked to its
# original, which stays as it was: each row's page names the other.
outbox_edits = sa.Table(
    "outbox_edits",
    metadata,
    sa.Column("copy_id", ROW_ID, primary_key=True, autoincrement=False),
    sa.Column("original_id", ROW_ID, nullable=False),
    sa.Column("edited_at", UTCDateTime(), nullable=False, server_default=stored_now()),
    sa.Column("edited_by", SHORT_TEXT, nullable=False),
)
sa.Index("outbox_edits_original_idx", outbox_edits.c.original_id)

# Console sessions ended before their time (a logout): a session's cookie stays signed and
# within its lifetime, so the console refuses it by its id here, until its lifetime is over
# (``ends_at``; rows past it are deleted at the next logout). The id is a SHA-256 of the
# session's nonce, never the nonce its CSRF token comes from.
console_sessions_ended = sa.Table(
    "console_sessions_ended",
    metadata,
    sa.Column("session_id", SHORT_TEXT, primary_key=True),
    sa.Column("ends_at", UTCDateTime(), nullable=False),
)
