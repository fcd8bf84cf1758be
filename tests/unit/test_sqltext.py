"""What the inbox's guard finds in a handler's SQL text (``relay.db.sqltext``), table-driven
over the three databases' ways of reading it: a statement that ends or splits the
transaction is found however it is dressed, and nothing inside a comment, a string or a
quoted identifier is taken for one."""

from __future__ import annotations

import pytest

from relay.db.dialects import Dialect, of
from relay.db.inbox import TRANSACTION_STATEMENTS
from relay.db.sqltext import ends_transaction, statements

POSTGRESQL, SQLITE, MYSQL = of("postgresql"), of("sqlite"), of("mysql")
EVERY = (POSTGRESQL, SQLITE, MYSQL)

# (text, the databases it is read on, what the guard finds there: None for nothing)
CASES: list[tuple[str, tuple[Dialect, ...], str | None]] = [
    ("COMMIT", EVERY, "COMMIT"),
    ("  commit work", EVERY, "COMMIT"),
    ("/* settle */ COMMIT", EVERY, "COMMIT"),
    ("-- settle\nCOMMIT", EVERY, "COMMIT"),
    ("/* a /* nested */ comment */ ROLLBACK", (POSTGRESQL,), "ROLLBACK"),
    ("# settle\nCOMMIT", (MYSQL,), "COMMIT"),
    ("/*!50000 COMMIT */", (MYSQL,), "COMMIT"),
    ("/*! SET autocommit = 1 */", (MYSQL,), "SET AUTOCOMMIT"),
    ("INSERT INTO t VALUES (1); COMMIT", EVERY, "COMMIT"),
    ("INSERT INTO t VALUES (';'); COMMIT", EVERY, "COMMIT"),
    ("SELECT 1--1\n; COMMIT", (MYSQL,), "COMMIT"),
    ("SELECT 'a\\'; COMMIT; --'", (MYSQL,), None),  # MySQL escapes the quote
    ("SELECT 'a\\'; COMMIT; --'", (POSTGRESQL, SQLITE), "COMMIT"),  # the others do not
    ("SELECT E'a\\'; COMMIT; --'", (POSTGRESQL,), None),
    ("SELECT $$; COMMIT; $$", (POSTGRESQL,), None),
    ("SELECT $tag$ $$; COMMIT; $tag$", (POSTGRESQL,), None),
    ("SELECT 'COMMIT'", EVERY, None),
    ('SELECT "commit" FROM t', EVERY, None),
    ("UPDATE t SET committed = true", EVERY, None),
    ("INSERT INTO commits VALUES (1)", EVERY, None),
    ("-- COMMIT\nSELECT 1", EVERY, None),
    ("/* COMMIT */ SELECT 1", EVERY, None),
    ("SET autocommit = 1", EVERY, "SET AUTOCOMMIT"),
    ("SET @@autocommit := 1", EVERY, "SET AUTOCOMMIT"),
    ("SET @@session.autocommit = ON", EVERY, "SET AUTOCOMMIT"),
    ("SET SESSION autocommit = 1", EVERY, "SET AUTOCOMMIT"),
    ("SET sql_mode = '', autocommit = 1", EVERY, "SET AUTOCOMMIT"),
    ("SET LOCAL lock_timeout = '1s'", EVERY, None),
    ("START TRANSACTION", EVERY, "START TRANSACTION"),
    ("SAVEPOINT s1", EVERY, "SAVEPOINT"),
    ("RELEASE SAVEPOINT s1", EVERY, "RELEASE"),
    ("END", EVERY, "END"),
    ("ABORT", (POSTGRESQL,), "ABORT"),
    ("PREPARE TRANSACTION 'x'", (POSTGRESQL,), "PREPARE TRANSACTION"),
    ("XA START 'x'", (MYSQL,), "XA"),
    ("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE", EVERY, "SET TRANSACTION"),
    # MySQL commits before these; PostgreSQL and SQLite run them in the transaction.
    ("CREATE TABLE t (a int)", (MYSQL,), "CREATE"),
    ("CREATE TABLE t (a int)", (POSTGRESQL, SQLITE), None),
    ("ALTER TABLE t ADD b int", (MYSQL,), "ALTER"),
    ("DROP TABLE t", (MYSQL,), "DROP"),
    ("TRUNCATE t", (MYSQL,), "TRUNCATE"),
    ("LOCK TABLES t WRITE", (MYSQL,), "LOCK"),
    ("UNLOCK TABLES", (MYSQL,), "UNLOCK"),
    ("ANALYZE TABLE t", (MYSQL,), "ANALYZE"),
    ("LOAD INDEX INTO CACHE t", (MYSQL,), "LOAD INDEX"),
    ("LOCK TABLE t IN ACCESS EXCLUSIVE MODE", (POSTGRESQL,), None),
    ("", EVERY, None),
    (";;", EVERY, None),
]


@pytest.mark.parametrize(
    ("text", "dialect", "found"),
    [(text, dialect, found) for text, where, found in CASES for dialect in where],
    ids=[f"{dialect.name}: {text!r}" for text, where, _ in CASES for dialect in where],
)
def test_the_guard_finds_what_ends_a_transaction(
    text: str, dialect: Dialect, found: str | None
) -> None:
    enders = TRANSACTION_STATEMENTS | dialect.implicit_commits
    assert ends_transaction(text, dialect.sql_lexicon, enders) == found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SELECT 1", [("SELECT", "1")]),
        ("a; b ;; c", [("A",), ("B",), ("C",)]),
        ("select 'x;y', \"q\" -- c\n", [("SELECT", "'", ",", '"')]),
        ("/* unterminated", []),
        ("'unterminated; COMMIT", [("'",)]),
    ],
)
def test_statements_are_read_past_comments_and_quotes(
    text: str, expected: list[tuple[str, ...]]
) -> None:
    assert statements(text, POSTGRESQL.sql_lexicon) == expected
