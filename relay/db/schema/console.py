"""The operator console's tables (``relay.console``): its audit, the parked rows it
discarded or edited, and the sessions ended before their time."""

from __future__ import annotations

import sqlalchemy as sa

from relay.db.columns import (
    LONG_TEXT,
    PAYLOAD,
    ROW_ID,
    SHORT_TEXT,
    UTCDateTime,
    stored_now,
)
from relay.db.schema.metadata import metadata

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
