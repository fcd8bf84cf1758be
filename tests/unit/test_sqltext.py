"""What the inbox's guard finds in a handler's SQL text (``relay.db.sqltext``), table-driven
over the three databases' ways of reading it: a statement that ends or splits the
transaction is found however it is dressed, and nothing inside a comment, a string or a
quoted identifier is taken for one."""

from __future__ import annotations

import pytest

from relay.db.dialects import Dialect, of
from relay.db.inbox_transaction import INBOX_TABLES, TRANSACTION_STATEMENTS
from relay.db.sqltext import refusal, statements

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
    # MariaDB's compound statements outside a procedure: each piece, and the one that closes.
    ("REPEAT COMMIT; UNTIL 1 END REPEAT", (MYSQL,), "REPEAT"),
    ("l1: REPEAT EXECUTE IMMEDIATE 'COMMIT'; UNTIL 1 END REPEAT l1", (MYSQL,), "UNTIL"),
    ("WHILE 0 DO COMMIT; END WHILE", (MYSQL,), "END"),
    ("/*! SET autocommit = 1 */", (MYSQL,), "SET AUTOCOMMIT"),
    ("INSERT INTO t VALUES (1); COMMIT", EVERY, "COMMIT"),
    ("INSERT INTO t VALUES (';'); COMMIT", EVERY, "COMMIT"),
    ("SELECT 1--1\n; COMMIT", (MYSQL,), "COMMIT"),
    # Read both ways: a session may escape with a backslash or not (PostgreSQL's
    # standard_conforming_strings, MySQL's NO_BACKSLASH_ESCAPES).
    ("SELECT 'a\\'; COMMIT; --'", EVERY, "COMMIT"),
    ("SELECT E'a\\'; COMMIT; --'", (POSTGRESQL,), None),  # escaped whatever the session
    ("SELECT 'a\\\\'", EVERY, None),
    ("SELECT 1 AS `a\\`; COMMIT; -- `", (MYSQL,), "COMMIT"),  # a backtick escapes nothing
    ("/*M! COMMIT */", (MYSQL,), "COMMIT"),
    ("/*M!100000 COMMIT */", (MYSQL,), "COMMIT"),
    ("EXECUTE IMMEDIATE 'COMMIT'", (MYSQL,), "EXECUTE"),
    ("PREPARE s FROM 'SET autocommit = 1'", (MYSQL,), "PREPARE"),
    ("BACKUP STAGE START", (MYSQL,), "BACKUP"),
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
    ("SET LOCAL lock_timeout = '1s'", (POSTGRESQL,), None),
    ("SET CONSTRAINTS ALL DEFERRED", (POSTGRESQL,), None),
    # A session's settings would outlive the message on the pooled connection.
    ("SET synchronous_commit = off", (POSTGRESQL,), "changes the connection's session"),
    ("SET SESSION statement_timeout = 0", (POSTGRESQL,), "session"),
    ("RESET ALL", (POSTGRESQL,), "session"),
    ("DISCARD ALL", (POSTGRESQL,), "session"),
    ("SET @total = 1", (MYSQL,), None),
    ("SET @total = 1, @@session.sql_mode = ''", (MYSQL,), "session"),
    ("SET sql_mode = ''", (MYSQL,), "session"),
    ("SET NAMES latin1", (MYSQL,), "session"),
    ("SET STATEMENT max_statement_time=1 FOR SELECT 1", (MYSQL,), "session"),
    ("USE other_db", (MYSQL,), "session"),  # the next messages' statements would go there
    ("/* x */ use `other` ; SELECT 1", (MYSQL,), "session"),
    ("PRAGMA synchronous = OFF", (SQLITE,), "session"),
    ("PRAGMA synchronous(0)", (SQLITE,), "session"),
    ("PRAGMA synchronous", (SQLITE,), None),
    # The inbox's own tables: a handler's lock on them would stop the inbox's own look.
    ("LOCK TABLE inbox_received", (POSTGRESQL,), "inbox_received"),
    ('DELETE FROM "inbox_attempts"', (POSTGRESQL, SQLITE), "inbox_attempts"),
    ("UPDATE public.inbox_received SET received_at = now()", (POSTGRESQL,), "inbox_received"),
    ("SELECT * FROM `inbox_received`", (MYSQL,), "inbox_received"),
    # SQLite's other quotes of a name: brackets, and a string where a name goes.
    ("DELETE FROM [inbox_received] WHERE message_id = 'm-1'", (SQLITE,), "inbox_received"),
    ("DELETE FROM [main].[Inbox_Received]", (SQLITE,), "inbox_received"),
    ("SELECT 1 AS [it's]; DELETE FROM inbox_received; SELECT 'x'", (SQLITE,), "inbox_received"),
    ("SELECT 1 AS [--]; DELETE FROM inbox_received", (SQLITE,), "inbox_received"),
    ("DELETE FROM 'inbox_received'", (SQLITE,), "inbox_received"),
    ("SELECT [commit] FROM t; SELECT ']; COMMIT'", (SQLITE,), None),
    ("SELECT 1 FROM t WHERE a = 'inbox_received'", (POSTGRESQL, MYSQL), None),
    # PostgreSQL's name spelt in escapes, with its escape character or another.
    ('DELETE FROM U&"inbox\\005Freceived"', (POSTGRESQL,), "inbox_received"),
    ('DELETE FROM u&"\\+000069nbox_attempts"', (POSTGRESQL,), "inbox_attempts"),
    ("DELETE FROM U&\"inbox!005freceived\" UESCAPE '!'", (POSTGRESQL,), "inbox_received"),
    ('SELECT U&"a""b" FROM t; SELECT U&"x" UESCAPE \'!\'; COMMIT', (POSTGRESQL,), "COMMIT"),
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
    # An outside review's: read otherwise than the server reads them, these hid a COMMIT.
    ("SELECT $é$ ' $é$; COMMIT; SELECT ' '", (POSTGRESQL,), "COMMIT"),
    ("SELECT $ф_1$ ; $ф_1$", (POSTGRESQL,), None),
    ("SELECT 1; --\rCOMMIT", EVERY, "COMMIT"),
    ("/*! /* a comment */ COMMIT */", (MYSQL,), "COMMIT"),
    ("/*M!100000 /* a comment */ CREATE TABLE t (a int) */", (MYSQL,), "CREATE"),
    ("/*! SELECT '*/' */; COMMIT", (MYSQL,), "COMMIT"),
    ("/*! */ COMMIT", (MYSQL,), "COMMIT"),
    ("/*!50000 SELECT 1 */; SELECT 2", (MYSQL,), None),
    # SQLite's trigger is one statement, its body's ``;`` and ``END`` included; a statement
    # after it is judged.
    ("CREATE TRIGGER t AFTER INSERT ON e BEGIN INSERT INTO l VALUES (1); END", (SQLITE,), None),
    ('CREATE TEMP TRIGGER "t" AFTER INSERT ON e BEGIN SELECT 1; END;', (SQLITE,), None),
    (
        "CREATE TRIGGER t AFTER INSERT ON e BEGIN "
        "UPDATE l SET a = CASE a WHEN 1 THEN 2 END; SELECT CASE WHEN 1 THEN 2 END; END",
        (SQLITE,),
        None,
    ),
    ("CREATE TRIGGER t AFTER INSERT ON e BEGIN SELECT 1; END; COMMIT", (SQLITE,), "COMMIT"),
    (
        "CREATE TRIGGER t AFTER INSERT ON e BEGIN DELETE FROM inbox_received; END",
        (SQLITE,),
        "inbox_received",
    ),
    # PostgreSQL's dollar-quoted bodies (a DO block's, a function's) are read for the inbox's
    # names, nested ones too; a COMMIT there is none of the statement's.
    ("DO $$ BEGIN DELETE FROM inbox_received; END $$", (POSTGRESQL,), "inbox_received"),
    (
        "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS $f$ BEGIN "
        "EXECUTE $q$DELETE FROM public.inbox_attempts$q$; RETURN NULL; END $f$",
        (POSTGRESQL,),
        "inbox_attempts",
    ),
    ("DO $$ BEGIN PERFORM 1; END $$", (POSTGRESQL,), None),
    # A quoted word is never a keyword: no trigger, no body.
    ('CREATE TABLE "trigger" (begin int); COMMIT', (SQLITE,), "COMMIT"),
    ('CREATE "TRIGGER" t BEGIN SELECT 1; COMMIT', (SQLITE,), "COMMIT"),
]


@pytest.mark.parametrize(
    ("text", "dialect", "found"),
    [(text, dialect, found) for text, where, found in CASES for dialect in where],
    ids=[f"{dialect.name}: {text!r}" for text, where, _ in CASES for dialect in where],
)
def test_the_guard_finds_what_a_handler_may_not_run(
    text: str, dialect: Dialect, found: str | None
) -> None:
    enders = TRANSACTION_STATEMENTS | dialect.implicit_commits
    why = refusal(text, dialect.sql_lexicon, enders, dialect.changes_session, INBOX_TABLES)
    if found is None:
        assert why is None
    else:
        assert why is not None and found.lower() in why.lower()


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("SELECT 1", [("SELECT", "1")]),
        ("a; b ;; c", [("A",), ("B",), ("C",)]),
        ("select 'x;y', \"q\" -- c\n", [("SELECT", "'", ",", "Q")]),
        ("/* unterminated", []),
        ("DO $b$ BEGIN NULL; END $b$", [("DO", "$", "$BEGIN", "$NULL", "$END")]),
        ("'unterminated; COMMIT", [("'",)]),
    ],
)
def test_statements_are_read_past_comments_and_quotes(
    text: str, expected: list[tuple[str, ...]]
) -> None:
    assert statements(text, POSTGRESQL.sql_lexicon) == expected
