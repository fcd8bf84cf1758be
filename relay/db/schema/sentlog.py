"""The sent log: the keys of the messages acked, kept for the dedupe horizon, and where the
database journals it, its journal and its state (``relay.db.sentlog``)."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from relay.db.columns import (
    ROW_ID,
    SENT_KEY,
    UTCDateTime,
)
from relay.db.dialects import of
from relay.db.schema.metadata import metadata


def _log(name: str) -> sa.Table:
    """A sent log: an entry per message id's key, with the acked row's id and times."""
    return sa.Table(
        name,
        metadata,
        sa.Column("key", SENT_KEY, primary_key=True),
        sa.Column("id", ROW_ID, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("sent_at", UTCDateTime(), nullable=False),
    )


# The sent log: what is left of an acked row when acked rows leave the outbox (the default,
# ``keep_sent = ids``). Its keys keep message ids unique beyond the outbox for the dedupe
# horizon (the retention): a relay's claim probes it for every row it claims and drops,
# unpublished, a row whose message id is here (``relay.db.claims``), whoever the writer
# was. Its times serve ``relay status`` (sent counts, latency) and the purge. Made by
# migration 0015 beside the log of the releases before (``outbox_sent_legacy``), which their
# relays go on writing while they run.
outbox_sent = _log("outbox_sent_log")

# The sent log of the releases before migration 0015, which their relays write and probe.
# Kept, not renamed or rewritten, so that they publish on while the schema is migrated and
# until the protocol fence hands the outbox to this release's relays (``relay.buckets``).
# This release writes nothing to it: its claims probe it beside the log (a relay of the
# release before that acks late, past its lease, is still seen), and its purge empties it
# over the horizon. A later release contracts it, once the purge has.
outbox_sent_legacy = _log("outbox_sent")
# Its purge's index (migration 0008).
sa.Index("outbox_sent_time_idx", outbox_sent_legacy.c.sent_at)


def _unjournaled(*_args: Any, dialect: sa.Dialect, **_kw: Any) -> bool:
    return not of(dialect).journals_sent_log


# The purge and ``relay status`` find entries by their sent time. A B-tree: a BRIN index
# assumed the log's physical order was its time order, which the purge undoes (migration
# 0008). New entries go to its right edge. Not where the log is journaled: the journal's
# time order serves there (``relay.db.sentlog.entries``).
sa.Index("outbox_sent_log_time_idx", outbox_sent.c.sent_at).ddl_if(callable_=_unjournaled)

# PostgreSQL (``relay.db.dialects.base.Dialect.journals_sent_log``, migration 0015): the log
# above is UNLOGGED, and each ack's new entries also go, as one row, to this journal, which
# is logged. An ack adds its key to a random page of the log's key index; once that index
# has more pages than acks arrive between two checkpoints, nearly every ack wrote a whole
# page to the WAL (``full_page_writes``, about 5.5 KB), nine times the writer's INSERT at the
# default retention. Unlogged, the log writes no WAL; the journal's rows are appended in
# time order, a few dozen bytes an entry, and purged whole. A crash or a failover to a
# standby empties the log (and ``outbox_sent_state``); claims then take nothing until a
# relay has copied the journal back into it (``relay.db.sentlog``): dedupe stays exact.
outbox_sent_journal = sa.Table(
    "outbox_sent_journal",
    metadata,
    sa.Column("sent_at", UTCDateTime(), primary_key=True),
    # The lowest of ``ids``: an acked row is logged once, so this tells rows of one sent
    # time apart (the purge and a rebuild read the journal in (sent_at, id) order).
    sa.Column("id", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("message_keys", postgresql.ARRAY(sa.Uuid(as_uuid=False)), nullable=False),
    sa.Column("ids", postgresql.ARRAY(sa.BigInteger()), nullable=False),
    sa.Column("created_at", postgresql.ARRAY(sa.DateTime(timezone=True)), nullable=False),
)

# Where the log is journaled: the journal's entries sealed into runs, each the entries of a
# span of sent times in key order, in blocks of at most ``SENT_RUN_BLOCK`` keys found by
# their first key (``relay.db.sentruns``). Written once, in key order, and merged into
# longer runs as they pile up, a run costs a few dozen bytes of WAL an entry; it is logged,
# so a crash leaves it whole. After a crash a relay copies back into the log only the
# journal's entries no run holds (minutes of acks), and claims then look up, beside the log,
# the runs' blocks of the keys they claim, until the whole log is rebuilt
# (``relay.db.sentlog``): delivery waits seconds, not the rebuild of a week's log.
outbox_sent_runs = sa.Table(
    "outbox_sent_runs",
    metadata,
    sa.Column("run", sa.BigInteger(), sa.Identity(), primary_key=True),
    # The level (0 for a run sealed from the journal, n + 1 for one merged from runs of n)
    # and the span of sent times [first_at, upto) whose journaled entries it holds.
    sa.Column("level", sa.SmallInteger(), nullable=False),
    sa.Column("first_at", UTCDateTime(), nullable=False),
    sa.Column("upto", UTCDateTime(), nullable=False),
    sa.Column("entries", sa.BigInteger(), nullable=False),
    # While a merge writes it, a range of keys a transaction (``relay.db.sentmerge``):
    # lookups may read it meanwhile (it holds a part of what its inputs hold, which stay
    # until it is done), the purge leaves it and its inputs be.
    sa.Column("building", sa.Boolean(), nullable=False, server_default=sa.false()),
    # Of a run being merged, or replaced by a merge and not swept yet: the run it goes into.
    sa.Column("merged_into", sa.BigInteger()),
)
outbox_sent_blocks = sa.Table(
    "outbox_sent_blocks",
    metadata,
    sa.Column("run", sa.BigInteger(), primary_key=True, autoincrement=False),
    sa.Column("first_key", sa.Uuid(as_uuid=False), primary_key=True),
    # Side by side, in key order: each entry's key and sent time.
    sa.Column("message_keys", postgresql.ARRAY(sa.Uuid(as_uuid=False)), nullable=False),
    sa.Column("sent_at", postgresql.ARRAY(sa.DateTime(timezone=True)), nullable=False),
)

# Whether the sent log is whole, one row: claims take nothing without it
# (``relay.db.sentlog.complete``). On PostgreSQL it is UNLOGGED, as the log is: a crash
# empties both, and the relay that rebuilds the log from its journal holds the row's lock
# meanwhile, and marks it complete when done. ``recovering``: the log holds the journal's
# entries that no run holds, and claims look up the runs for the rest, while the rest is
# copied. Elsewhere the log is never emptied behind the relays' backs, and the row stays.
outbox_sent_state = sa.Table(
    "outbox_sent_state",
    metadata,
    sa.Column("log", sa.SmallInteger(), primary_key=True, autoincrement=False),
    sa.Column("complete", sa.Boolean(), nullable=False),
    sa.Column("recovering", sa.Boolean(), nullable=False, server_default=sa.false()),
)
# ``outbox_sent_state.log``: the one row's key.
SENT_LOG = 1


def built_on(table: sa.Table, dialect: sa.Dialect | str) -> bool:
    """Whether the migrations build ``table`` on ``dialect``: every table, but the sent log's
    journal and its runs only where the log is journaled (``Dialect.journals_sent_log``)."""
    journaled = (outbox_sent_journal, outbox_sent_runs, outbox_sent_blocks)
    return table not in journaled or of(dialect).journals_sent_log
