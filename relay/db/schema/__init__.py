"""The schema: the one definition used by Alembic, the relay and the Spark writer, a module
per role. ``outbox``: the outbox table and its indexes; ``sentlog``: the sent log, its
journal and its state; ``relays``: the relays' leases, protocol and counters; ``inbox``: the
consumers' inbox; ``console``: the operator console's tables. Every table is declared in
``metadata``; importing this package declares them all.
"""

from relay.db.schema.console import (
    console_audit,
    console_sessions_ended,
    outbox_archive,
    outbox_edits,
)
from relay.db.schema.inbox import (
    INBOX_KEY_TEXT,
    inbox_attempts,
    inbox_received,
)
from relay.db.schema.metadata import metadata
from relay.db.schema.outbox import (
    CONSOLE_CAUSE_INDEX,
    CONSOLE_EXCHANGE_INDEX,
    CONSOLE_INDEXES,
    CONSOLE_MESSAGE_INDEX,
    MYSQL_SKIPPED_INDEXES,
    ROW_COLUMNS,
    WRITER_COLUMNS,
    WRITTEN_COLUMNS,
    exchange_key,
    index_columns,
    outbox,
    reason_prefix,
)
from relay.db.schema.relays import (
    COUNTERS,
    DUPLICATES,
    bucket_column,
    outbox_buckets,
    outbox_counters,
    outbox_protocol,
    outbox_relays,
)
from relay.db.schema.sentlog import (
    SENT_LOG,
    built_on,
    outbox_sent,
    outbox_sent_blocks,
    outbox_sent_journal,
    outbox_sent_legacy,
    outbox_sent_runs,
    outbox_sent_state,
)

__all__ = [
    "CONSOLE_CAUSE_INDEX",
    "CONSOLE_EXCHANGE_INDEX",
    "CONSOLE_INDEXES",
    "CONSOLE_MESSAGE_INDEX",
    "COUNTERS",
    "DUPLICATES",
    "INBOX_KEY_TEXT",
    "MYSQL_SKIPPED_INDEXES",
    "ROW_COLUMNS",
    "SENT_LOG",
    "WRITER_COLUMNS",
    "WRITTEN_COLUMNS",
    "bucket_column",
    "built_on",
    "console_audit",
    "console_sessions_ended",
    "exchange_key",
    "inbox_attempts",
    "inbox_received",
    "index_columns",
    "metadata",
    "outbox",
    "outbox_archive",
    "outbox_buckets",
    "outbox_counters",
    "outbox_edits",
    "outbox_protocol",
    "outbox_relays",
    "outbox_sent",
    "outbox_sent_blocks",
    "outbox_sent_journal",
    "outbox_sent_legacy",
    "outbox_sent_runs",
    "outbox_sent_state",
    "reason_prefix",
]
