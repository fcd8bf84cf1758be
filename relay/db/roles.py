"""The database roles of an outbox deployment, and exactly what each is granted.

- **migrator**: runs ``relay migrate``; owns the tables (PostgreSQL) or has every privilege
  on the database (MariaDB, MySQL). Nothing else needs its rights, and nothing in the
  schema runs with them: the outbox has no triggers, functions or procedures.
- **relay**: ``relay run`` (claims, settles, turns, retention) and ``relay status``.
- **writer**: plain SQL writers, ``relay enqueue`` and the Spark writer: INSERT on the
  outbox's message columns (``WRITER_COLUMNS``), nothing else: not its id (one ahead of the
  sequence would fail later writers' INSERTs), status, attempts or due time (a row written
  as sent would never be published).
- **consumer**: an inbox consumer (``relay.inbox``): its keys and attempts, nothing of the
  outbox's (and what its handler writes, which is the user's to grant).
- **console**: ``relay console``: reads the outbox and the relays' tables; changes parked
  rows (replay: UPDATE; discard: DELETE into the archive; restore and an edited copy:
  INSERT), writes its audit log and links, and forgets a requeued dead letter's attempts.
  Nothing of the sent log's but its count, nothing of the inbox's keys.

The docs (Operations, least privilege) print these statements, and the tests run each role
with them and no more.
"""

from __future__ import annotations

from relay.db.dialects import of
from relay.db.schema import WRITER_COLUMNS, built_on, metadata

RELAY = "relay"
WRITER = "writer"
CONSUMER = "consumer"
CONSOLE = "console"

# Privileges per role, per table.
PRIVILEGES: dict[str, dict[str, str]] = {
    RELAY: {
        "outbox": "SELECT, UPDATE, DELETE",
        # UPDATE: on PostgreSQL an ack replaces an older entry of its key (relay.db.settles).
        "outbox_sent_log": "SELECT, INSERT, UPDATE, DELETE",
        "outbox_buckets": "SELECT, UPDATE",
        "outbox_relays": "SELECT, INSERT, UPDATE, DELETE",
        # UPDATE: the first relay of a protocol to take the outbox over raises the least one.
        "outbox_protocol": "SELECT, UPDATE",
        "outbox_counters": "SELECT, UPDATE",
        "outbox_sent_journal": "SELECT, INSERT, DELETE",
        "outbox_sent_runs": "SELECT, INSERT, DELETE",
        "outbox_sent_blocks": "SELECT, INSERT, DELETE",
        "outbox_sent_state": "SELECT, INSERT, UPDATE",
        # The log of the releases before (migration 0015): probed by claims, purged.
        "outbox_sent": "SELECT, DELETE",
    },
    WRITER: {"outbox": f"INSERT ({', '.join(WRITER_COLUMNS)})"},
    CONSUMER: {
        "inbox_received": "SELECT, INSERT, DELETE",
        "inbox_attempts": "SELECT, INSERT, UPDATE, DELETE",
    },
    CONSOLE: {
        "outbox": "SELECT, INSERT, UPDATE, DELETE",
        "outbox_sent_log": "SELECT",
        "outbox_sent_journal": "SELECT",
        "outbox_sent": "SELECT",
        "outbox_buckets": "SELECT",
        "outbox_relays": "SELECT",
        "outbox_protocol": "SELECT",
        # UPDATE: a restore locks the rows it moves (FOR UPDATE needs it), and changes none.
        "outbox_archive": "SELECT, INSERT, UPDATE, DELETE",
        "outbox_edits": "SELECT, INSERT",
        "console_audit": "SELECT, INSERT, UPDATE",
        "console_sessions_ended": "SELECT, INSERT, DELETE",
        "inbox_attempts": "SELECT, DELETE",
    },
}
# Tables whose new rows take their ids from a sequence, per role (PostgreSQL's USAGE).
SEQUENCES = {WRITER: ("outbox",), CONSOLE: ("outbox", "console_audit")}


def grants(dialect: str, role: str, grantee: str, database: str = "") -> list[str]:
    """The GRANT statements that give ``grantee`` the privileges of ``role`` on the database
    ``dialect`` names: on PostgreSQL run in the outbox's database, on MySQL naming it
    (``database``) and the account (``grantee`` as ``'name'@'host'``)."""
    own = of(dialect)
    statements = [
        own.grant(privileges, table, grantee, database)
        for table, privileges in PRIVILEGES[role].items()
        if built_on(metadata.tables[table], dialect)
    ]
    return [*statements, *own.sequence_grants(grantee, SEQUENCES.get(role, ()))]
