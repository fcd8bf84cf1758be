"""The relays' shared state: who is alive, which relay owns which bucket of the outbox, the
least protocol a relay must speak, and the running totals ``relay status`` reads."""

from __future__ import annotations

import sqlalchemy as sa

from relay.constants import (
    BUCKET_SPAN_ROWS,
    BUCKET_STRIDE,
    OUTBOX_BUCKETS,
)
from relay.db.columns import (
    SHORT_TEXT,
    UTCDateTime,
)
from relay.db.schema.metadata import metadata

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
