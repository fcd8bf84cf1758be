"""The migrations build exactly the table that relay.schema defines, on every database, and
downgrade cleanly: the one schema definition and the shipped migrations cannot drift apart."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from relay.db.engine import migrate
from relay.db.schema import metadata, outbox


def differences(url: str) -> list[object]:
    """Alembic's comparison, plus the text collations it does not compare."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            found: list[object] = list(compare_metadata(context, metadata))
            for column in sa.inspect(conn).get_columns("outbox"):
                want = outbox.c[column["name"]].type.dialect_impl(conn.dialect)
                collations = (
                    getattr(column["type"], "collation", None),
                    getattr(want, "collation", None),
                )
                if collations[0] != collations[1]:
                    found.append(("collation", column["name"], *collations))
            return found
    finally:
        engine.dispose()


def test_migrated_database_matches_the_schema_definition(database_url: str) -> None:
    assert differences(database_url) == []


def test_migrations_downgrade_to_nothing_and_upgrade_again(database_url: str) -> None:
    migrate(database_url, "base", downgrade=True)
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        assert not sa.inspect(conn).has_table("outbox")
    engine.dispose()
    migrate(database_url)
    assert differences(database_url) == []
