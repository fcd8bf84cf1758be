"""The consumers' inbox (``relay.inbox``): the messages each consumer processed, and its
failed attempts."""

from __future__ import annotations

import sqlalchemy as sa

from relay.db.columns import (
    SHORT_TEXT,
    UTCDateTime,
    stored_now,
)
from relay.db.schema.metadata import metadata

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
