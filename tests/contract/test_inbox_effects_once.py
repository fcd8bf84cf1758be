"""The inbox's "effects once" where a handler's transaction ends, or is undone in part, in
ways its key's look missed (issue 71, an outside review's second round), through the blocking
and the asyncio stores driven by the inbox's own decisions: another delivery's committed key
taken for the run's own, a table the rollback cannot undo, a commit made not durable."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from devtools.servers import PostgresServer
from relay.db.engine import create_engine
from relay.db.migrate import migrate
from relay.records import Answer, Verdict
from tests.contract.test_inbox_store import KINDS, WRITE, Consumer, keys, noted
from tests.support import inbox_script
from tests.support.inbox_script import Script, effects


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def url(database_url: str) -> str:
    engine = create_engine(database_url)
    effects.create(engine)
    engine.dispose()
    return database_url


@pytest.fixture
def consumer(kind: str, url: str) -> Iterator[Consumer]:
    made = Consumer(kind, url)
    yield made
    made.close()


@pytest.fixture
def calls() -> Iterator[dict[str, Callable[[], None]]]:
    yield inbox_script.CALLS
    inbox_script.CALLS.clear()


def dead_lettered_once(consumer: Consumer, url: str, script: Script, why: str = "") -> None:
    """``script``'s run dead-lettered at once (naming ``why``), its key kept: its redelivery
    dead-lettered again, never run, its part ``charged`` done once."""
    answer = consumer.process("m-1", script)
    assert answer.verdict is Verdict.DEAD_LETTER
    assert answer.reason is not None
    assert why in str(answer.reason["x-inbox-error"])
    assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.DEAD_LETTER
    assert (noted(url), keys(url)) == (["charged"], ["m-1"])


@pytest.mark.databases("postgresql", "mariadb")
def test_another_deliverys_committed_key_is_not_the_runs_own(
    consumer: Consumer, url: str, calls: dict[str, Callable[[], None]]
) -> None:
    """The message's transaction rolled back under its handler (the driver's rollback; on
    MariaDB a deadlock alike): a second consumer of the name, given the message again, finds
    no key, runs and commits. The first handler goes on, writes again through its driver and
    returns: its look at the end found the second's committed key and took it for its own,
    committed its write and acked, the message's effect twice. (SQLite's consumers run one at
    a time: no second one runs meanwhile.)"""
    twin = Consumer("blocking", url)
    answers: list[Answer] = []
    calls["twin"] = lambda: answers.append(
        twin.process("m-1", [("write", "twin")], redelivered=True)
    )
    redone = ("cursor", "INSERT INTO effects (note) VALUES ('first')")
    try:
        first = consumer.process(
            "m-1", [("write", "first"), ("driver", "rollback"), ("call", "twin"), redone]
        )
    finally:
        twin.close()
    assert [answer.verdict for answer in answers] == [Verdict.ACK]
    assert (noted(url), keys(url)) == (["twin"], ["m-1"])
    # Dead-lettered (it cannot be told from the handler's own commit everywhere), its key kept.
    assert first.verdict is Verdict.DEAD_LETTER
    assert first.reason is not None
    assert "another delivery of the message" in str(first.reason["x-inbox-error"])
    assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.DEAD_LETTER
    assert noted(url) == ["twin"]


@pytest.mark.databases("postgresql", "mariadb")
def test_the_runs_own_commit_past_tx_is_told_where_the_database_can(
    consumer: Consumer, url: str
) -> None:
    """The handler's own commit through its driver, then a return: PostgreSQL tells its
    committed key by the transaction that wrote it (acked, all of it committed); MariaDB
    cannot tell it from another delivery's: dead-lettered, its key kept, never done twice."""
    answer = consumer.process("m-1", [("write", "a"), ("driver", "commit")])
    own = Verdict.ACK if consumer.store.engine.dialect.name == "postgresql" else Verdict.DEAD_LETTER
    assert answer.verdict is own
    assert consumer.process("m-1", WRITE, redelivered=True).verdict is own  # as it was
    assert (noted(url), keys(url)) == (["a"], ["m-1"])


def _without_transactions(url: str, engine: str) -> None:
    """The handlers' table ``effects`` made again in ``engine``, one without transactions."""
    database = create_engine(url)
    with database.begin() as conn:
        conn.exec_driver_sql("DROP TABLE effects")
        conn.exec_driver_sql(
            "CREATE TABLE effects (note VARCHAR(64) NOT NULL, secret VARCHAR(64) UNIQUE) "
            f"ENGINE={engine}"
        )
    database.dispose()


@pytest.mark.databases("mariadb")
@pytest.mark.parametrize("engine", ["MyISAM", "Aria", "MEMORY"])
def test_a_write_the_rollback_cannot_undo_is_not_done_again(
    consumer: Consumer, url: str, engine: str
) -> None:
    """A handler's table of an engine without transactions keeps its write whatever the
    inbox's rollback does (MariaDB warns so at the ROLLBACK): the handler then failed, and
    its retries wrote it again, once an attempt. Dead-lettered at once instead, its key
    kept, naming why."""
    _without_transactions(url, engine)
    dead_lettered_once(consumer, url, [("write", "charged"), ("raise", "")], "cannot roll back")
    # A failure that wrote nothing there is retried as ever, on the same connection.
    assert consumer.process("m-2", [("raise", "")]).verdict is Verdict.RETRY


@pytest.mark.databases("mariadb")
@pytest.mark.parametrize("end", ["return", "raise"])
def test_a_write_the_drivers_rollback_left_is_not_done_again(
    consumer: Consumer, url: str, end: str
) -> None:
    """A write to a table without transactions, then the driver's rollback (a library's
    clean-up): MariaDB's warning that the rollback left a part is the ROLLBACK's. With the
    handler returning, the inbox's look at its savepoint failed first and its error took
    the warning's place: the run was retried, the write done at each attempt (review79's
    d10). Dead-lettered at once, its key kept, either way."""
    _without_transactions(url, "Aria")
    script = [("write", "charged"), ("driver", "rollback")]
    script += [("raise", "")] if end == "raise" else []
    dead_lettered_once(consumer, url, script, "cannot roll back")


@pytest.mark.databases("mariadb")
@pytest.mark.parametrize("stage", ["CALL stage_note('{}')", "SELECT stage_note_f('{}')"])
def test_a_temporary_table_a_procedure_left_is_not_inherited(
    consumer: Consumer, url: str, stage: str
) -> None:
    """A procedure (or a function) the handler calls stages the message's row in a
    temporary table it makes if missing, applies what is staged, and never empties it: the
    next message on the pooled connection applied the earlier ones' rows again, each effect
    once more a message after it (review79's d1). The connection that made one is
    discarded after its run."""
    database = create_engine(url)
    with database.begin() as conn:
        body = (
            "CREATE TEMPORARY TABLE IF NOT EXISTS staged (note VARCHAR(64)) ENGINE=InnoDB; "
            "INSERT INTO staged VALUES (n); INSERT INTO effects (note) SELECT note FROM staged;"
        )
        conn.exec_driver_sql(f"CREATE PROCEDURE stage_note(n VARCHAR(64)) BEGIN {body} END")
        conn.exec_driver_sql(
            f"CREATE FUNCTION stage_note_f(n VARCHAR(64)) RETURNS INT BEGIN {body} RETURN 1; END"
        )
    database.dispose()
    for message in ("m-1", "m-2", "m-3"):
        script = [("sql", stage.format(message))]
        assert consumer.process(message, script).verdict is Verdict.ACK
    assert (noted(url), keys(url)) == (["m-1", "m-2", "m-3"], ["m-1", "m-2", "m-3"])


# A write to a table without transactions, then the transaction ended under the handler in
# ways that leave the ROLLBACK's warning unread at the end (review82's a1, a4): a statement
# after the driver's rollback, a procedure's rollback on its error, a commit the guard
# refused (SQLAlchemy lets its transaction go; the pool's rollback warned, unread).
ENDED_AFTER_A_WRITE_THAT_STAYS = {
    "the driver's rollback, then a read": [
        ("write", "charged"),
        ("driver", "rollback"),
        ("sql", "SELECT COUNT(*) FROM effects"),
    ],
    "a procedure's rollback on its error": [("sql", "CALL charge('charged')")],
    "a commit the guard refused": [("write", "charged"), ("door", "the connection's commit")],
}


@pytest.mark.databases("mariadb")
@pytest.mark.parametrize("ended", ENDED_AFTER_A_WRITE_THAT_STAYS)
def test_a_write_that_stays_is_not_done_again_however_the_transaction_ended(
    consumer: Consumer, url: str, ended: str
) -> None:
    """Retried, the write to the table without transactions was done at each attempt (3
    times). Dead-lettered at once, its key kept: the warning read where it can be, and a
    transaction ended under the handler taken to have left a part where the database holds
    such a table."""
    _without_transactions(url, "Aria")
    database = create_engine(url)
    with database.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE ledger (id INT PRIMARY KEY) ENGINE=InnoDB")
        conn.exec_driver_sql("INSERT INTO ledger VALUES (42)")
        conn.exec_driver_sql(
            "CREATE PROCEDURE charge(n VARCHAR(64)) BEGIN "
            "DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END; "
            "INSERT INTO effects (note) VALUES (n); INSERT INTO ledger VALUES (42); END"
        )
    database.dispose()
    dead_lettered_once(consumer, url, ENDED_AFTER_A_WRITE_THAT_STAYS[ended])


@pytest.mark.databases("mariadb")
def test_a_user_variable_or_a_named_lock_is_not_the_next_messages(
    consumer: Consumer, url: str
) -> None:
    """A user variable a run set stayed on the pooled connection: the next message's lookup
    that found no row read the last one's value (review82's a7). A named lock a failed run
    took held every other session off it (a10). Both let go after each run."""
    first = [("sql", "SET @customer = 'the first'"), ("sql", "SELECT GET_LOCK('order-42', 0)")]
    assert consumer.process("m-1", [*first, ("raise", "")]).verdict is Verdict.RETRY
    after = "INSERT INTO effects (note) SELECT COALESCE(@customer, 'nobody')"
    assert consumer.process("m-2", [("sql", after)]).verdict is Verdict.ACK
    assert noted(url) == ["nobody"]
    database = create_engine(url)
    with database.connect() as conn:
        assert conn.exec_driver_sql("SELECT GET_LOCK('order-42', 0)").scalar() == 1
    database.dispose()


@pytest.mark.databases("mariadb")
def test_user_variables_are_all_set_back_when_their_list_is_cut_short(
    consumer: Consumer, url: str
) -> None:
    """The list of user variables to set back comes from a GROUP_CONCAT, which cuts it at
    group_concat_max_len (a handler's thousands of variables reached the default 1 MB, cut
    on an item's end: those after it stayed set, review83's b6). Cut here after the first:
    the rest are read again, a row each."""
    left = [
        ("cursor", "SET SESSION group_concat_max_len = 11"),  # '@`a` = NULL', the first alone
        ("sql", "SET @a = 'a', @b = 'b', @c = 'c'"),
    ]
    assert consumer.process("m-1", left).verdict is Verdict.ACK
    read = "INSERT INTO effects (note) SELECT CONCAT_WS(',', @a, @b, @c, 'read')"
    assert consumer.process("m-2", [("sql", read)]).verdict is Verdict.ACK
    assert noted(url) == ["read"]


@pytest.mark.databases("mariadb")
def test_a_default_database_a_handler_left_is_not_the_next_messages(
    consumer: Consumer, url: str
) -> None:
    """A handler's ``USE`` through the driver (``tx``'s is refused) left the pooled session
    in another database: the next message's key and work went there, or failed there as if
    the database were away (review83's b7). The connection is discarded after the run."""
    left = [("write", "a"), ("cursor", "USE information_schema")]
    assert consumer.process("m-1", left).verdict is Verdict.ACK
    assert consumer.process("m-2", WRITE).verdict is Verdict.ACK
    assert (noted(url), keys(url)) == (["a", "done"], ["m-1", "m-2"])


# What a previous message left on the pooled connection before a deadlock (review83's b5):
# nothing, or a procedure's clean-up of a temporary table it had not made.
BEFORE_THE_DEADLOCK = {
    "nothing": [],
    "a procedure's DROP TEMPORARY TABLE IF EXISTS": [("sql", "CALL clean_up()")],
}


@pytest.mark.databases("mariadb")
@pytest.mark.parametrize("before", BEFORE_THE_DEADLOCK)
def test_a_plain_deadlock_is_retried_on_a_database_holding_a_table_without_transactions(
    consumer: Consumer, url: str, calls: dict[str, Callable[[], None]], before: str
) -> None:
    """The handler's writes all InnoDB, a deadlock raised as it came: its transaction rolled
    back whole, nothing of it left. On a database that merely held a MEMORY table the run
    was taken to have left a part there (the warnings were not trusted: mysqlclient's errno
    was reset by the closed cursor), dead-lettered at once with its key kept, its work then
    never done (review83's b1); a DROP TEMPORARY TABLE IF EXISTS of an earlier message on the
    pooled connection made it look like a commit (b5). Retried, then processed once."""
    database = create_engine(url)
    with database.begin() as conn:
        conn.exec_driver_sql("CREATE TABLE acct (id INT PRIMARY KEY, n INT) ENGINE=InnoDB")
        conn.exec_driver_sql("INSERT INTO acct VALUES (1, 0), (2, 0)")
        conn.exec_driver_sql("CREATE TABLE heavy (x INT) ENGINE=InnoDB")
        conn.exec_driver_sql("CREATE TABLE cache (k INT PRIMARY KEY) ENGINE=MEMORY")
        conn.exec_driver_sql(
            "CREATE PROCEDURE clean_up() BEGIN DROP TEMPORARY TABLE IF EXISTS batch_tmp; END"
        )
    assert consumer.process("m-0", BEFORE_THE_DEADLOCK[before]).verdict is Verdict.ACK
    other: list[threading.Thread] = []

    def heavier_the_other_way() -> None:
        # Another session, heavier (the handler's is the victim), holds row 2 and then
        # wants row 1, which the handler holds.
        ready = threading.Event()

        def run() -> None:
            with database.connect() as conn:
                conn.exec_driver_sql("INSERT INTO heavy SELECT seq FROM seq_1_to_2000")
                conn.exec_driver_sql("UPDATE acct SET n = n + 1 WHERE id = 2")
                ready.set()
                time.sleep(0.3)
                conn.exec_driver_sql("UPDATE acct SET n = n + 1 WHERE id = 1")
                conn.rollback()

        other.append(threading.Thread(target=run))
        other[-1].start()
        ready.wait(10)

    calls["other"] = heavier_the_other_way
    deadlocked = [
        ("write", "charged"),
        ("sql", "UPDATE acct SET n = n + 1 WHERE id = 1"),
        ("call", "other"),
        ("sql", "UPDATE acct SET n = n + 1 WHERE id = 2"),
    ]
    try:
        first = consumer.process("m-1", deadlocked)
    finally:
        for thread in other:
            thread.join(30)
        database.dispose()
    assert first.verdict is Verdict.RETRY, first.reason
    assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.ACK
    assert (noted(url), keys(url)) == (["done"], ["m-0", "m-1"])


# The driver's rollback, then a write and a commit through it: past the inbox's transaction.
WENT_ON = [
    ("driver", "rollback"),
    ("cursor", "INSERT INTO effects (note) VALUES ('charged')"),
    ("driver", "commit"),
]


@pytest.mark.databases("sqlite")
def test_a_handler_that_blinds_sqlites_watch_never_does_it_twice(
    consumer: Consumer, url: str
) -> None:
    """The inbox's watch of an SQLite connection's statements is sqlite3's trace callback;
    a handler set its own, then went on past its transaction's rollback and failed: its
    committed write was retried, done again at each attempt. A watch that hears nothing
    cannot tell what ran: dead-lettered at once, its key kept."""
    dead_lettered_once(consumer, url, [("untraced", ""), *WENT_ON, ("raise", "")])


@pytest.mark.databases("sqlite")
def test_the_watch_is_the_pooled_connections_again_after_a_handler_replaced_it(
    consumer: Consumer, url: str
) -> None:
    """A handler that set its own trace callback and returned left the pooled connection
    unwatched: the next message's run went on past its rollback unseen. The watch is set
    again after each run: an innocent failure is retried, a run that went on dead-lettered."""
    assert consumer.process("m-1", [("untraced", ""), ("write", "a")]).verdict is Verdict.ACK
    assert consumer.process("m-2", [("write", "b"), ("raise", "")]).verdict is Verdict.RETRY
    assert consumer.process("m-3", [*WENT_ON, ("raise", "")]).verdict is Verdict.DEAD_LETTER
    assert consumer.process("m-3", WRITE, redelivered=True).verdict is Verdict.DEAD_LETTER
    assert noted(url) == ["a", "charged"]


# Where a handler leaves its listener, and the run that leaves it: the listener writes and
# commits through the driver at the inbox's own commit (a run that returns) or rollback (one
# that raises).
LISTENERS = {
    "at the commit, on its connection": [("write", "a"), ("listen", "connection:commit")],
    "at the rollback, on its connection": [
        ("write", "a"),
        ("listen", "connection:rollback"),
        ("raise", ""),
    ],
    "at the commit, on its engine": [("write", "a"), ("listen", "engine:commit")],
}


@pytest.mark.parametrize("left", LISTENERS, ids=list(LISTENERS))
def test_a_listener_the_handler_leaves_never_runs_at_the_inboxs_end(
    consumer: Consumer, url: str, left: str
) -> None:
    """A listener left through a result's ``context.root_connection`` ran at the inbox's own
    commit or rollback, after the guard and the key's look: a driver's rollback there had the
    message acked with nothing committed, a driver's commit there committed a failed run's
    work at each attempt. Taken off, the run refused and dead-lettered, nothing committed."""
    answer = consumer.process("m-1", LISTENERS[left])
    assert answer.verdict is Verdict.DEAD_LETTER
    assert answer.reason is not None
    assert str(answer.reason["x-inbox-error"]).startswith("ListenersLeft:")
    assert (noted(url), keys(url)) == ([], [])
    # Nothing of it is left for the next runs, on the pool's connections or the engine.
    assert consumer.process("m-2", [("write", "b")]).verdict is Verdict.ACK
    assert consumer.process("m-3", [("write", "c"), ("raise", "")]).verdict is Verdict.RETRY
    assert (noted(url), keys(url)) == (["b"], ["m-2"])


def test_a_commit_the_handler_made_not_durable_is_flushed_before_the_ack(kind: str) -> None:
    """PostgreSQL: a handler set ``synchronous_commit`` off for its transaction and committed
    it through the driver, key and work (then returned: all of it committed, acked). The
    inbox's look and commit then ran in a transaction that wrote nothing, whose commit waits
    for no flush: the message was acked, and a crash of the server within the WAL writer's
    delay lost its key and its work (review79's d4; the writer's delay made 10 s here, so
    that the crash falls within it). A server of its own, crashed: an immediate stop."""
    script = [
        ("sql", "SET LOCAL synchronous_commit = off"),
        ("write", "kept"),
        ("driver", "commit"),
    ]
    # Not under pytest's base temp, which another pytest session can make root's alone.
    with tempfile.TemporaryDirectory(prefix="relay-tests-crash-") as base:
        server = PostgresServer(Path(base), settings=["wal_writer_delay=10000ms"])
        server.start()
        try:
            url = server.url()
            migrate(url)
            engine = create_engine(url)
            effects.create(engine)
            engine.dispose()
            consumer = Consumer(kind, url)
            try:
                assert consumer.process("m-1", script).verdict is Verdict.ACK
            finally:
                consumer.close()
            server.stop("immediate")
            server.start()
            assert (noted(url), keys(url)) == (["kept"], ["m-1"])
        finally:
            server.stop()
