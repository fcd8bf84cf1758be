"""MySQL's and MariaDB's part for the inbox (``relay.db.dialects.inbox``): how its guard reads
a handler's SQL, and how it tells what a handler did to the message's transaction and session
past the guard."""

from __future__ import annotations

import re
from typing import Any, ClassVar

import sqlalchemy as sa

from relay.db.dialects.inbox import COMMITS_MADE, InboxDialect
from relay.db.sqltext import Lexicon

# ER_DUP_ENTRY, and the key its message names (after the value it quotes).
_DUPLICATE_ENTRY = 1062
_DUPLICATE_KEY = re.compile(r"for key '([^']*)'$")
# The inbox's savepoint after its key (``MySQL.mark_key``); no such one: ER_SP_DOES_NOT_EXIST.
_KEY_SAVEPOINT = "relay_inbox_key"
_NO_SAVEPOINT = 1305
# ER_WARNING_NOT_COMPLETE_ROLLBACK: non-transactional tables changed, not rolled back.
_NOT_ROLLED_BACK = 1196
# What a session holds past its transactions that the inbox's sessions never make
# (``MySQLInbox.session_left``), read in one statement, the named locks released in it: the
# count of temporary tables it made, its procedures', functions' and triggers' too (no view
# lists them before MariaDB 11.2), its default database (a handler's driver's ``select_db``),
# and its user variables (MariaDB's view; how many, and a list that GROUP_CONCAT may cut
# short). MySQL: the count alone (its status is SHOW's).
_SESSION_LEFT_MARIADB = """\
SELECT (SELECT VARIABLE_VALUE FROM information_schema.SESSION_STATUS
        WHERE VARIABLE_NAME = 'COM_CREATE_TEMPORARY_TABLE'),
       RELEASE_ALL_LOCKS(),
       DATABASE(),
       (SELECT COUNT(*) FROM information_schema.USER_VARIABLES WHERE VARIABLE_VALUE IS NOT NULL),
       (SELECT GROUP_CONCAT(CONCAT('@`', REPLACE(VARIABLE_NAME, '`', '``'), '` = NULL'))
        FROM information_schema.USER_VARIABLES WHERE VARIABLE_VALUE IS NOT NULL)"""
_USER_VARIABLES = (
    "SELECT CONCAT('@`', REPLACE(VARIABLE_NAME, '`', '``'), '` = NULL') "
    "FROM information_schema.USER_VARIABLES WHERE VARIABLE_VALUE IS NOT NULL"
)
# User variables set back to NULL a statement at a time at most.
_VARIABLES_A_STATEMENT = 1000
_TEMPORARY_TABLES_MADE = "SHOW SESSION STATUS LIKE 'Com_create_temporary_table'"
# The session's counts of the statements that commit (``MySQLInbox.went_on``): its COMMITs
# and XA COMMITs (the driver's ``commit()``, a cursor's, a procedure's), compared with
# SQLAlchemy's (``COMMITS_MADE``); and those that commit what is open before they run
# (BEGIN, which SQLAlchemy never sends here; definitions, locks, accounts), which the inbox's
# sessions never run.
_COMMITTING = ("Com_commit", "Com_xa_commit")
_COMMITS_BEFORE = ("Com_begin", "Com_create_", "Com_alter_", "Com_drop_", "Com_rename_")
_COMMITS_BEFORE_EXACTLY = (
    "Com_truncate",
    "Com_lock_tables",
    "Com_grant",
    "Com_revoke",
    "Com_analyze",
    "Com_optimize",
    "Com_check",
    "Com_repair",
    "Com_flush",
    "Com_reset",
    "Com_preload_keys",
    "Com_assign_to_keycache",
    "Com_install_plugin",
    "Com_uninstall_plugin",
    "Com_change_master",
)
# A temporary table's CREATE and DROP commit nothing (a made one has the connection discarded:
# ``session_left``; a ``DROP TEMPORARY TABLE IF EXISTS`` of none, a procedure's clean-up,
# leaves a count on the pooled connection an innocent deadlock later was taken for a commit).
_COMMITS_NOTHING = ("Com_create_temporary_table", "Com_drop_temporary_table")
_STATEMENTS_RUN = "SHOW SESSION STATUS LIKE 'Com\\_%'"
# A table of an engine without transactions in the consumer's database: where one is, a
# transaction rolled back under the handler, whose warning that it left a part cannot be
# read any more, is taken to have left one. (Another database's such tables, written by a
# handler by their qualified names: not looked for.)
_WITHOUT_TRANSACTIONS = """\
SELECT 1 FROM information_schema.TABLES t JOIN information_schema.ENGINES e
  ON e.ENGINE = t.ENGINE
WHERE e.TRANSACTIONS <> 'YES' AND t.TABLE_TYPE = 'BASE TABLE' AND t.TABLE_SCHEMA = DATABASE()
LIMIT 1"""
# ER_LOCK_DEADLOCK, in the warnings read at a failed run's end: the deadlock was the last
# statement, and rolled the whole transaction back, its warnings the rollback's (whether it
# left a part in a table without transactions: 1196).
_DEADLOCK = 1213
# A connection's info, for a run (``MySQLInbox.mark_key`` forgets them): whether the key's
# transaction is over (``_key_gone``); whether it ended with a part left in a table without
# transactions (for ``MySQLInbox.rolled_back_in_part``), and whether the warnings read say
# so for sure (the statement that ended it was the last before they were read).
_KEY_GONE = "relay_inbox_key_gone"
_LEFT_IN_PART = "relay_inbox_left_in_part"
_WARNINGS_TOLD = "relay_inbox_warnings_told"


class MySQLInbox(InboxDialect):
    """The inbox's part of ``relay.db.dialects.mysql.MySQL``."""

    sql_lexicon: ClassVar[Lexicon] = Lexicon(
        hash_comments=True,
        executable_comments=True,
        dash_comment_needs_space=True,
        backslash_escapes=True,
    )
    # Statements that commit the transaction before they run (MySQL's "statements that cause
    # an implicit commit"): definitions, locks, accounts, administration, replication,
    # MariaDB's backup stages; and dynamic SQL (PREPARE, EXECUTE, EXECUTE IMMEDIATE), whose
    # statement the guard cannot read. A temporary table's CREATE and DROP do not commit, but
    # are refused with the rest; and MariaDB's REPEAT ... UNTIL, run outside a procedure
    # (`REPEAT COMMIT; UNTIL 1 END REPEAT` committed; the others close with END, refused).
    implicit_commits: ClassVar[frozenset[tuple[str, ...]]] = frozenset(
        (word,)
        for word in [
            "ALTER",
            "CREATE",
            "DROP",
            "RENAME",
            "TRUNCATE",
            "LOCK",
            "UNLOCK",
            "GRANT",
            "REVOKE",
            "ANALYZE",
            "OPTIMIZE",
            "REPAIR",
            "CACHE",
            "FLUSH",
            "RESET",
            "INSTALL",
            "UNINSTALL",
            "START",
            "STOP",
            "CHANGE",
            "BACKUP",
            "PREPARE",
            "EXECUTE",
            "REPEAT",
            "UNTIL",
        ]
    ) | {("LOAD", "INDEX"), ("CHECK", "TABLE"), ("SET", "PASSWORD")}

    def mark_key(self, conn: sa.Connection) -> None:
        # A row does not say which transaction wrote it here; a savepoint is its
        # transaction's, and goes with it (a deadlock's rollback, the driver's rollback or
        # commit): found at the end, the transaction is the key's.
        for kept in (_KEY_GONE, _LEFT_IN_PART, _WARNINGS_TOLD):
            conn.info.pop(kept, None)
        conn.exec_driver_sql(f"SAVEPOINT {_KEY_SAVEPOINT}")

    def key_marked(self, conn: sa.Connection) -> bool | None:
        return not _key_gone(conn, failed=False)

    def went_on(self, conn: sa.Connection) -> bool | None:
        # The key's transaction over (rolled back under the handler, by the driver or a
        # deadlock): whether a part of the handler's work may have been committed since,
        # through a COMMIT that was not SQLAlchemy's (the driver's, an XA one, a
        # procedure's), a statement that commits before it runs, or the driver's autocommit
        # left on. Not seen: autocommit turned on and off again (docs/inbox.md).
        if not _key_gone(conn, failed=True):
            return False
        if self.session_changed(conn.connection.driver_connection):
            return True
        counts = {name: int(value) for name, value in _through_driver(conn, _STATEMENTS_RUN)}
        commits = sum(counts.get(name, 0) for name in _COMMITTING)
        before = sum(
            value
            for name, value in counts.items()
            if (name.startswith(_COMMITS_BEFORE) or name in _COMMITS_BEFORE_EXACTLY)
            and name not in _COMMITS_NOTHING
        )
        return commits > conn.info.get(COMMITS_MADE, 0) or before > 0

    def rolled_back_in_part(self, conn: sa.Connection) -> bool:
        # A table without transactions (MyISAM, Aria, MEMORY) keeps what was written to it,
        # and the ROLLBACK warns so: a retry would write it again. A round trip, here alone;
        # through the driver where SQLAlchemy let its transaction go (a commit the guard
        # refused), or its warning would be the pool's rollback's, unread.
        left = conn.info.pop(_LEFT_IN_PART, False)
        if conn.in_transaction():
            conn.rollback()
        else:
            conn.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
        if left or _left_in_part(conn):
            return True
        # Ended under the handler, its ROLLBACK's warning maybe gone with a statement after
        # it (an outside review): taken to have left a part where a table could hold one.
        told = conn.info.get(_WARNINGS_TOLD, True)
        return not told and bool(_through_driver(conn, _WITHOUT_TRANSACTIONS))

    def changes_session(self, words: tuple[str, ...]) -> bool:
        # A user variable (SET @name = ...) is let through: it lasts the session too, and is
        # set back to NULL after each run (``session_left``; MariaDB's). Any system variable
        # (SET name, SET @@name, SET SESSION ..., SET NAMES, SET STATEMENT ...) is refused, and
        # USE (the next message's statements would go to that database: an outside review).
        if words[0] == "USE":
            return True
        if words[0] != "SET":
            return False
        user_only = len(words) > 1 and words[1].startswith("@") and not words[1].startswith("@@")
        return not user_only or any(word.startswith("@@") for word in words)

    def session_left(self, conn: sa.Connection) -> str | None:
        # A procedure that stages rows in a temporary table and never empties it had the
        # next message on the pooled connection apply them again; a user variable set for
        # one message was the next's (``SELECT ... INTO @customer`` finding no row); a named
        # lock a failed run took held others off (outside reviews). A temporary table, made
        # and dropped since or not: the connection goes. Variables and locks: let go here.
        # A round trip a message, 0.5 ms of it here against 0.2 ms for a SELECT 1.
        if not getattr(conn.dialect, "is_mariadb", False):
            made = _through_driver(conn, _TEMPORARY_TABLES_MADE)
            return "a temporary table" if made and int(made[0][1]) else None
        row = _through_driver(conn, _SESSION_LEFT_MARIADB)[0]
        temporary, _locks, database, count, variables = row
        if int(temporary or 0):
            return "a temporary table"
        if database != conn.engine.url.database:
            return f"another default database ({database})"
        if count:
            resets = [str(variables)]
            if len(resets[0].split("` = NULL")) - 1 < count:  # cut short: one by one
                resets = [str(r[0]) for r in _through_driver(conn, _USER_VARIABLES)]
            for at in range(0, len(resets), _VARIABLES_A_STATEMENT):
                _through_driver(conn, "SET " + ", ".join(resets[at : at + _VARIABLES_A_STATEMENT]))
        return None

    def session_changed(self, driver: Any) -> bool:
        # mysqlclient's, PyMySQL's and aiomysql's: the server's status of its last answer.
        return bool(driver.get_autocommit())

    def error_facts(self, error: BaseException) -> list[str] | None:
        # mysqlclient's and PyMySQL's (aiomysql's) errors alike: (number, message); the
        # message quotes values ("Duplicate entry '4111...' for key 'pan'"), the key's name
        # is kept alone.
        args = getattr(error, "args", ())
        if type(error).__module__.partition(".")[0] not in ("MySQLdb", "pymysql"):
            return None
        if not args or not isinstance(args[0], int):
            return []
        facts = [f"MySQL error {args[0]}"]
        key = _DUPLICATE_KEY.search(str(args[1])) if len(args) > 1 else None
        if args[0] == _DUPLICATE_ENTRY and key is not None:
            facts.append(f"key {key.group(1)}")
        return facts

    def durability_problem(self, conn: sa.Connection) -> str | None:
        # The flush is the server's alone.
        flush = int(conn.scalar(sa.text("SELECT @@innodb_flush_log_at_trx_commit")) or 0)
        if flush == 1:
            return None
        return (
            f"the server's innodb_flush_log_at_trx_commit is {flush}, not 1: a crash of its "
            "host can lose the last second of commits, and a message the inbox acked as "
            "processed with them"
        )


def _key_gone(conn: sa.Connection, failed: bool) -> bool:
    """Whether the transaction that inserted the run's key on ``conn`` is over, its savepoint
    (``MySQLInbox.mark_key``) gone with it: asked once a run. The handler's last statement may
    have ended it (the driver's ROLLBACK, a deadlock, a procedure's ROLLBACK), and its warning
    that a part stayed (``rolled_back_in_part``) the release's error would replace: read
    first, after a ``failed`` run, or where the driver says there may be one (no round trip
    else on a run that returned)."""
    gone = conn.info.get(_KEY_GONE)
    if gone is not None:
        return bool(gone)
    driver = conn.connection.driver_connection
    warned = _warnings(conn) if failed or _may_have_warned(driver) else set()
    left = _NOT_ROLLED_BACK in warned
    try:
        _through_driver(conn, f"RELEASE SAVEPOINT {_KEY_SAVEPOINT}")
    except sa.exc.DBAPIError as exc:
        if exc.orig is None or exc.orig.args[:1] != (_NO_SAVEPOINT,):
            raise
        conn.info[_KEY_GONE], conn.info[_LEFT_IN_PART] = True, left
        conn.info[_WARNINGS_TOLD] = left or _DEADLOCK in warned
        return True
    conn.info[_KEY_GONE] = False
    return False


def _may_have_warned(driver: Any) -> bool:
    """Whether the statement last sent on the driver's connection ``driver`` may have left
    warnings, as the driver knows without a round trip: mysqlclient counts the last
    statement's; aiomysql counts none of its own ROLLBACK's, and says whether the
    transaction is over (then its end may have warned)."""
    counted = getattr(driver, "warning_count", None)
    if callable(counted):
        return bool(counted())
    return not driver.get_transaction_status()


def _left_in_part(conn: sa.Connection) -> bool:
    """Whether the statement last sent on ``conn`` warned that a rollback left a part."""
    return _NOT_ROLLED_BACK in _warnings(conn)


def _warnings(conn: sa.Connection) -> set[int]:
    """The codes of the warnings and the error the statement last sent on ``conn`` left."""
    return {int(row[1]) for row in _through_driver(conn, "SHOW WARNINGS")}


def _through_driver(conn: sa.Connection, sql: str) -> list[Any]:
    """``sql`` run through the driver's connection under ``conn`` (the asyncio driver's as
    SQLAlchemy adapts it), whatever SQLAlchemy's transaction's state: a handler's commit the
    guard refused leaves it to be rolled back, and no statement through it runs. Its rows;
    its error as SQLAlchemy's would be, the connection invalidated when it was lost."""
    driver: Any = conn.connection.dbapi_connection
    dbapi: Any = conn.dialect.loaded_dbapi
    try:
        cursor = driver.cursor()
        try:
            cursor.execute(sql)
            return list(cursor.fetchall() if cursor.description else [])
        finally:
            cursor.close()
    except dbapi.Error as exc:
        gone = conn.dialect.is_disconnect(exc, driver, None)
        if gone:
            conn.invalidate(exc)
        raise sa.exc.DBAPIError.instance(
            sql, None, exc, dbapi.Error, connection_invalidated=gone
        ) from exc
