"""What a PostgreSQL schema runs with rights other than its caller's."""

from __future__ import annotations

import sqlalchemy as sa

# Functions outside the system's schemas that run with their owner's rights.
DEFINER_FUNCTIONS = sa.text(
    "SELECT count(*) FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
    " WHERE p.prosecdef AND n.nspname NOT IN ('pg_catalog', 'information_schema')"
)


def definer_functions(conn: sa.Connection) -> int:
    return int(conn.execute(DEFINER_FUNCTIONS).scalar_one())
