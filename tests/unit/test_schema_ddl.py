"""The schema's DDL for servers the suite does not run (MySQL 8), compiled offline: the key
columns are in a NO PAD binary collation on both MySQL and MariaDB (migration 0010)."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import mysql

from relay.db.dialects.mysql import no_pad_collation
from relay.db.schema import inbox_received, outbox


def mariadb() -> sa.Dialect:
    dialect = mysql.dialect()
    dialect.is_mariadb = True
    return dialect


@pytest.mark.parametrize(
    ("dialect", "collation"),
    [(mysql.dialect(), "utf8mb4_0900_bin"), (mariadb(), "utf8mb4_nopad_bin")],
    ids=["mysql", "mariadb"],
)
def test_key_columns_compare_trailing_spaces_on_mysql_and_mariadb(
    dialect: sa.Dialect, collation: str
) -> None:
    assert no_pad_collation(dialect) == collation
    ddl = str(sa.schema.CreateTable(outbox).compile(dialect=dialect))
    assert f"message_id VARCHAR(255) COLLATE {collation} NOT NULL" in ddl
    assert "utf8mb4_bin" not in ddl
    inbox = str(sa.schema.CreateTable(inbox_received).compile(dialect=dialect))
    assert inbox.count(f"COLLATE {collation}") == 2
