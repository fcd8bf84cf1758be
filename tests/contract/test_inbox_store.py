"""The inbox's database side on SQLite, PostgreSQL and MariaDB, through the blocking store
(``relay.db.inbox``) and the asyncio one (``relay.db.inbox_async``) alike, each driven by the
inbox's own decisions (``relay.inbox.flow``): a key goes in once, with the writes of its
transaction or not at all; a handler cannot end that transaction by any door and have a
part of its work done twice; only real failures are counted; nothing recorded quotes a value."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import inspect
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.util import await_only

from devtools.servers import PostgresServer, wait_until
from relay.db import runlock
from relay.db.engine import create_engine
from relay.db.inbox import InboxStore
from relay.db.inbox_async import AsyncInboxStore, AsyncTransaction
from relay.db.inbox_transaction import TransactionEnded
from relay.db.roles import CONSUMER, grants
from relay.db.schema import inbox_attempts, inbox_received
from relay.errors import StoreError
from relay.inbox import InboxSettings
from relay.inbox.flow import Flow
from relay.inbox.steps import drive, drive_async
from relay.metrics import InboxMetrics
from relay.records import Answer, Delivery, Verdict
from tests.support import inbox_script
from tests.support.inbox_script import SECRET, Action, Script, effects
from tests.support.proxy import TcpProxy

KINDS = ("blocking", "asyncio")
# A hang guard for the other consumer's thread, not a window: how long a wait on it may last.
HANG_S = 60.0
# Sessions of the test's database waiting on a lock, in the server's own tables; SQLite's
# consumers wait on the run lock's file instead (``relay.db.runlock``), seen as they ask for it.
LOCK_WAITS = {
    "postgresql": (
        "SELECT count(*) FROM pg_stat_activity "
        "WHERE datname = current_database() AND wait_event_type = 'Lock'"
    ),
    "mysql": (
        "SELECT count(*) FROM information_schema.innodb_trx t "
        "JOIN information_schema.processlist p ON p.id = t.trx_mysql_thread_id "
        "WHERE t.trx_state = 'LOCK WAIT' AND p.db = DATABASE()"
    ),
}
# How often they are read: MariaDB refreshes innodb_trx only once it was last read more than
# 0.1 s before, and read every 0.05 s it showed the same moment for as long as it was read.
LOCK_WAITS_POLL_S = 0.2


class Consumer:
    """A consumer's store of one kind and its flow, one delivery at a time."""

    def __init__(self, kind: str, url: str, name: str = "billing") -> None:
        self.kind = kind
        settings = InboxSettings.load({}, {"inbox_queue": name, "inbox_max_attempts": "3"})
        self.loop = asyncio.new_event_loop()
        if kind == "blocking":
            self.store: Any = InboxStore(url, name)
        else:
            self.store = self.loop.run_until_complete(_async_store(url, name))
        self.flow = Flow(settings, self.store.statements, InboxMetrics(name))

    def process(self, key: str, script: Script, *, redelivered: bool = False) -> Answer:
        delivery = Delivery(key, b"{}", "x", "k", None, {}, redelivered)
        if self.kind == "blocking":
            with self.store.message(inbox_script.blocking(script)) as run:
                return drive(self.flow.process(delivery), run)

        async def process() -> Answer:
            async with self.store.message(inbox_script.asyncio(script)) as run:
                return await drive_async(self.flow.process(delivery), run)

        return self.loop.run_until_complete(process())

    def statement(self, name: str, *args: Any) -> Any:
        statement = getattr(self.store.statements, name)
        if self.kind == "blocking":
            return self.store.call(name, statement, *args)
        return self.loop.run_until_complete(self.store.call(name, statement, *args))

    def close(self) -> None:
        if self.kind == "blocking":
            self.store.close()
        else:
            self.loop.run_until_complete(self.store.close())
        self.loop.close()


async def _async_store(url: str, name: str) -> AsyncInboxStore:
    return AsyncInboxStore(url, name)  # its engine made on the loop it runs on


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


def noted(url: str) -> list[str]:
    return column(url, effects.c.note)


def keys(url: str) -> list[str]:
    return column(url, inbox_received.c.message_id)


def column(url: str, values: sa.Column[str]) -> list[str]:
    """A column's values, sorted, read from a connection of the test's own."""
    engine = create_engine(url)
    with engine.connect() as conn:
        found = sorted(conn.scalars(sa.select(values)))
    engine.dispose()
    return found


def attempts(url: str) -> list[tuple[str, int, str, bool]]:
    engine = create_engine(url)
    with engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                inbox_attempts.c.message_id,
                inbox_attempts.c.attempts,
                inbox_attempts.c.last_error,
                inbox_attempts.c.running,
            ).order_by(inbox_attempts.c.message_id)
        )
        found = [(m, a, e or "", r) for m, a, e, r in rows]
    engine.dispose()
    return found


WRITE = [("write", "done")]


def test_a_key_goes_in_once_with_its_transactions_writes(consumer: Consumer, url: str) -> None:
    assert consumer.process("m-1", [("write", "first")]).verdict is Verdict.ACK
    assert consumer.process("m-1", [("write", "twice")]).verdict is Verdict.ACK
    assert consumer.process("m-2", [("write", "rolled back"), ("raise", "")]).verdict is (
        Verdict.RETRY
    )
    assert consumer.process("m-2", [("write", "second")]).verdict is Verdict.ACK
    assert noted(url) == ["first", "second"]


def test_consumers_keep_their_own_keys(consumer: Consumer, url: str, kind: str) -> None:
    other = Consumer(kind, url, "audit")
    try:
        assert consumer.process("m-1", [("write", "billing")]).verdict is Verdict.ACK
        assert other.process("m-1", [("write", "audit")]).verdict is Verdict.ACK
        assert other.statement("count_attempt", "m-2", "boom") == 1
        assert consumer.statement("attempts", "m-2") == 0
    finally:
        other.close()
    assert noted(url) == ["audit", "billing"]


def test_a_second_delivery_waits_for_the_first_and_finds_it(url: str) -> None:
    """Two consumers of one name with the same message (redelivered after a lost connection):
    the second's insert waits on the first's uncommitted key, then sees it committed."""
    store, twin = InboxStore(url, "billing"), Consumer("blocking", url)
    inserted, second = threading.Event(), threading.Event()
    answers: list[Answer] = []

    def redelivered() -> None:
        inserted.wait(30)
        answers.append(twin.process("m-1", [("write", "twice")], redelivered=True))
        second.set()

    def slow(tx: Any) -> None:
        tx.execute(effects.insert(), {"note": "once"})
        inserted.set()
        assert not second.wait(0.5)  # the twin is still waiting on this key

    thread = threading.Thread(target=redelivered)
    thread.start()
    flow = Flow(
        InboxSettings.load({}, {"inbox_queue": "billing"}), store.statements, twin.flow.metrics
    )
    try:
        with store.message(slow) as run:
            delivery = Delivery("m-1", b"{}", "x", "k", None, {}, False)
            assert drive(flow.process(delivery), run).verdict is Verdict.ACK
        thread.join(60)
        assert [answer.verdict for answer in answers] == [Verdict.ACK]
        assert noted(url) == ["once"]
    finally:
        thread.join(60)
        twin.close()
        store.close()


# name -> (the scripts of a message's deliveries, each redelivered after the first, with the
# verdicts; the notes left; the attempts counted at the end (and whether a run is marked))
DOORS: dict[str, tuple[list[tuple[Script, Verdict]], list[str], int]] = {
    "COMMIT as SQL text: refused, rolled back, retried": (
        [
            ([("write", "a"), ("sql", "COMMIT"), ("write", "b")], Verdict.RETRY),
            (WRITE, Verdict.ACK),
        ],
        ["done"],
        1,
    ),
    "a comment before COMMIT: refused alike": (
        [([("write", "a"), ("sql", "/* settle */ COMMIT")], Verdict.RETRY), (WRITE, Verdict.ACK)],
        ["done"],
        1,
    ),
    "SET autocommit as SQL text: refused": (
        [([("write", "a"), ("sql", "SET @@autocommit = 1")], Verdict.RETRY), (WRITE, Verdict.ACK)],
        ["done"],
        1,
    ),
    "committed through the driver, then raised: dead-lettered, its part not written twice": (
        [
            ([("write", "half"), ("driver", "commit"), ("raise", "")], Verdict.DEAD_LETTER),
            (WRITE, Verdict.DEAD_LETTER),
        ],
        ["half"],
        1,
    ),
    "committed through a driver's cursor, then raised: dead-lettered alike": (
        [
            ([("write", "half"), ("cursor", "COMMIT"), ("raise", "")], Verdict.DEAD_LETTER),
            (WRITE, Verdict.DEAD_LETTER),
        ],
        ["half"],
        1,
    ),
}


DUPLICATE_ROLLS_BACK = "INSERT OR ROLLBACK INTO effects (note, secret) VALUES ('x', 'k')"
AUTOCOMMITTED = (
    "sql",
    "WITH e AS (SELECT 'after' AS note) INSERT INTO effects (note) SELECT note FROM e",
)
# Dead-lettered with its key kept, and again when it comes back (its recorded failure says
# so: acked, a dead letter lost on the way would be lost for good), its part done once.
DEAD_LETTERED_ONCE = ([Verdict.DEAD_LETTER, Verdict.DEAD_LETTER], 1)
RETRIED = ([Verdict.RETRY, Verdict.ACK], 1)
# Its part after the rollback ('b') done once, dead-lettered with its key kept, on every
# database (MariaDB's and MySQL's by the session's count of its COMMITs).
PART_B_ONCE_EVERYWHERE: dict[str, tuple[tuple[list[Verdict], int | None], list[str]]] = {
    db: (DEAD_LETTERED_ONCE, ["b"]) for db in ("sqlite", "postgresql", "mysql")
}
# A handler that goes on after its transaction was rolled back under it -> (its script; on
# each database that runs it, what becomes of the message's two deliveries (the second
# writes ``WRITE``) and the attempts counted, and the notes left)
WENT_ON: dict[str, tuple[Script, dict[str, tuple[tuple[list[Verdict], int | None], list[str]]]]] = {
    "the driver's commit, then a write through tx and returned": (
        [("write", "a"), ("driver", "commit"), ("write", "b")],
        {
            # The key committed with the first part; the write after is refused (sqlite3
            # would run a statement other than a row's change outside any transaction):
            # the part committed is the message's last.
            "sqlite": (DEAD_LETTERED_ONCE, ["a"]),
            "postgresql": (DEAD_LETTERED_ONCE, ["a"]),
            "mysql": (DEAD_LETTERED_ONCE, ["a"]),  # told from another delivery's: not here
        },
    ),
    "the driver's rollback, then returned": (
        [("write", "a"), ("driver", "rollback")],
        {
            "sqlite": (RETRIED, ["done"]),
            "postgresql": (DEAD_LETTERED_ONCE, []),  # whether it ran on is not seen
            "mysql": (RETRIED, ["done"]),
        },
    ),
    "SQLite's INSERT OR ROLLBACK, caught, then a statement sqlite3 begins no transaction for": (
        [
            ("write", "a"),
            ("sql", DUPLICATE_ROLLS_BACK),
            ("fails", DUPLICATE_ROLLS_BACK),
            AUTOCOMMITTED,
        ],
        {"sqlite": (RETRIED, ["done"])},
    ),
    "a trigger's RAISE(ROLLBACK), caught, then the same": (
        [
            ("write", "a"),
            ("fails", "INSERT INTO effects (note) VALUES ('roll back')"),
            AUTOCOMMITTED,
        ],
        {"sqlite": (RETRIED, ["done"])},
    ),
    "the driver's rollback, then a write through tx and returned": (
        [("write", "a"), ("driver", "rollback"), ("write", "b")],
        {
            "sqlite": (RETRIED, ["done"]),
            "postgresql": (DEAD_LETTERED_ONCE, []),
            "mysql": (RETRIED, ["done"]),
        },
    ),
    "the driver's rollback, then a write and a commit through the driver": (
        [
            ("write", "a"),
            ("driver", "rollback"),
            ("cursor", "INSERT INTO effects (note) VALUES ('b')"),
            ("driver", "commit"),
        ],
        PART_B_ONCE_EVERYWHERE,
    ),
    "the driver's rollback, then a write and a commit through the driver, then raised": (
        [
            ("write", "a"),
            ("driver", "rollback"),
            ("cursor", "INSERT INTO effects (note) VALUES ('b')"),
            ("driver", "commit"),
            ("raise", ""),
        ],
        PART_B_ONCE_EVERYWHERE,
    ),
    # Committed as XA does (``Com_xa_commit``, not ``Com_commit``: review82's a2).
    "the driver's rollback, then a write committed by XA, then raised": (
        [
            ("write", "a"),
            ("driver", "rollback"),
            ("cursor", "XA START 'handler'"),
            ("cursor", "INSERT INTO effects (note) VALUES ('b')"),
            ("cursor", "XA END 'handler'"),
            ("cursor", "XA COMMIT 'handler' ONE PHASE"),
            ("raise", ""),
        ],
        {"mysql": (DEAD_LETTERED_ONCE, ["b"])},
    ),
    # A statement that commits what is open before it runs, through the driver: counted as
    # a commit (``ANALYZE`` and its kin were not: review83's b2).
    "the driver's rollback, then a write and an ANALYZE TABLE through the driver, then raised": (
        [
            ("write", "a"),
            ("driver", "rollback"),
            ("cursor", "INSERT INTO effects (note) VALUES ('b')"),
            ("cursor", "ANALYZE TABLE effects"),
            ("raise", ""),
        ],
        {"mysql": (DEAD_LETTERED_ONCE, ["b"])},
    ),
    # The transaction the driver began after its commit reads the inbox's table, and holds
    # a lock on it: it was taken for the message's (a lock on the table was the sign), and
    # the part committed done again at each retry (an outside review).
    "the same, then a read of the inbox's table through the driver, then raised": (
        [
            ("write", "a"),
            ("driver", "rollback"),
            ("cursor", "INSERT INTO effects (note) VALUES ('b')"),
            ("driver", "commit"),
            ("cursor", "SELECT 1 FROM inbox_received LIMIT 0"),
            ("raise", ""),
        ],
        PART_B_ONCE_EVERYWHERE,
    ),
}


@pytest.mark.parametrize("door", WENT_ON, ids=list(WENT_ON))
def test_a_handler_that_goes_on_after_its_transaction_ended_never_does_it_twice(
    consumer: Consumer, url: str, door: str
) -> None:
    """A transaction rolled back under the handler (past the guard, or by a statement that
    rolls back as it fails), and the handler went on: what it did after ran outside the
    message's transaction, and a part of it committed once a retry. Refused where the guard
    sees it; dead-lettered, its key kept, where something may have been committed."""
    script, outcomes = WENT_ON[door]
    database = consumer.store.engine.dialect.name
    if database not in outcomes:
        pytest.skip(f"{database}: not its door, or not looked for there (docs/inbox.md)")
    (verdicts, counted), notes = outcomes[database]
    if database == "sqlite":
        engine = create_engine(url)
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "CREATE TRIGGER rolls_back BEFORE INSERT ON effects WHEN NEW.note = 'roll back' "
                "BEGIN SELECT RAISE(ROLLBACK, 'rolled back'); END"
            )
        engine.dispose()
    answers = [consumer.process("m-1", script), consumer.process("m-1", WRITE, redelivered=True)]
    assert [answer.verdict for answer in answers] == verdicts
    assert noted(url) == notes
    assert keys(url) == ["m-1"]
    assert [row[1] for row in attempts(url)] == ([] if counted is None else [counted])


# A handler cut off by what is not an error, after a part of its work committed past ``tx``
# -> (its script, the databases that see that part, the note committed).
CUT_OFF: dict[str, tuple[Script, tuple[str, ...], str]] = {
    "the driver's commit": (
        [("write", "a"), ("driver", "commit")],
        ("sqlite", "postgresql", "mysql"),  # MariaDB's dialect is named mysql
        "a",
    ),
    "the driver's rollback, then a write and a commit through the driver": (
        [
            ("driver", "rollback"),
            ("cursor", "INSERT INTO effects (note) VALUES ('b')"),
            ("driver", "commit"),
        ],
        ("sqlite", "postgresql", "mysql"),
        "b",
    ),
}


@pytest.mark.parametrize("interruption", inbox_script.INTERRUPTIONS)
@pytest.mark.parametrize("door", CUT_OFF, ids=list(CUT_OFF))
def test_a_handler_cut_off_after_committing_a_part_is_dead_lettered_then_cut_off(
    consumer: Consumer, url: str, door: str, interruption: str
) -> None:
    """A ``KeyboardInterrupt``, a ``SystemExit`` or a cancellation out of a handler that
    committed a part of its work past ``tx``: looked at as a failure is, dead-lettered at
    once (its key kept), and the interruption handed on, raised by the consumer once the
    broker is answered. It went out of the inbox unlooked at: the redelivery was acked as a
    duplicate with that part alone done, or ran that part again."""
    script, databases, note = CUT_OFF[door]
    if consumer.store.engine.dialect.name not in databases:
        pytest.skip("not looked for there (docs/inbox.md)")
    try:
        answer = consumer.process("m-1", [*script, ("cut", interruption)])
    except BaseException as escaped:  # not pytest's to take for the run's own Ctrl-C
        pytest.fail(f"{escaped!r} went out of the inbox unanswered")
    assert answer.verdict is Verdict.DEAD_LETTER
    assert type(answer.interrupted) is inbox_script.INTERRUPTIONS[interruption]
    assert answer.reason is not None
    assert str(answer.reason["x-inbox-error"]).startswith("TransactionEnded:")
    assert interruption in str(answer.reason["x-inbox-error"])
    assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.DEAD_LETTER
    assert (noted(url), keys(url)) == ([note], ["m-1"])


@pytest.mark.parametrize("interruption", inbox_script.INTERRUPTIONS)
def test_a_handler_cut_off_is_rolled_back_uncounted_and_the_interruption_goes_on(
    consumer: Consumer, url: str, interruption: str
) -> None:
    """Nothing committed past ``tx``: its run rolled back, nothing counted (as a consumer
    that died in its handler), and the interruption raised out of the inbox at once."""
    with pytest.raises(inbox_script.INTERRUPTIONS[interruption]):
        consumer.process("m-1", [("write", "a"), ("cut", interruption)])
    assert (noted(url), keys(url), attempts(url)) == ([], [], [])
    assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.ACK
    assert noted(url) == ["done"]


@pytest.mark.parametrize("door", DOORS, ids=list(DOORS))
def test_a_handler_cannot_end_the_transaction_without_its_retry_running(
    consumer: Consumer, url: str, door: str
) -> None:
    deliveries, notes, counted = DOORS[door]
    for n, (script, verdict) in enumerate(deliveries):
        assert consumer.process("m-1", script, redelivered=n > 0).verdict is verdict
    assert noted(url) == notes
    assert keys(url) == ["m-1"]
    assert [row[1] for row in attempts(url)] == ([counted] if counted else [])


def test_the_transactions_savepoints_are_the_handlers_to_use(consumer: Consumer, url: str) -> None:
    """``tx.savepoint()``: the guard lets the inbox's own savepoints through; a part whose
    block raised is undone alone."""
    parts = [("write", "a"), ("part", "b"), ("undone", "c"), ("part", "d")]
    assert consumer.process("m-1", parts).verdict is Verdict.ACK
    assert noted(url) == ["a", "b", "d"]


@pytest.mark.parametrize("door", inbox_script.DOORS)
def test_every_door_through_sqlalchemy_is_refused_even_when_swallowed(
    consumer: Consumer, url: str, door: str
) -> None:
    """A statement that carries a transaction's end in any construct, and the connection's
    and a session's own moves: refused before anything is sent, and the run failed even
    though the handler caught the refusal and returned; retried, its effects once."""
    refused = [("write", "a"), ("door", door), ("write", "b")]
    assert consumer.process("m-1", refused).verdict is Verdict.RETRY
    assert (noted(url), keys(url)) == ([], [])
    ((_key, counted, error, _running),) = attempts(url)
    assert (counted, error.split(":")[0]) == (1, "TransactionEnded")
    assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.ACK
    assert noted(url) == ["done"]


@pytest.mark.databases("postgresql", "mariadb")
def test_a_procedure_that_commits(consumer: Consumer, url: str) -> None:
    """MariaDB runs a procedure's COMMIT (found at the end: the key committed with its part,
    the handler failed after it: dead-lettered, never run again); PostgreSQL refuses one
    inside a transaction block (the handler's error: retried)."""
    engine = create_engine(url)
    body = "INSERT INTO effects (note) VALUES ('proc'); COMMIT;"
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            conn.exec_driver_sql(
                f"CREATE PROCEDURE commits_part() LANGUAGE plpgsql AS $$ BEGIN {body} END $$"
            )
        else:
            conn.exec_driver_sql(f"CREATE PROCEDURE commits_part() BEGIN {body} END")
    engine.dispose()
    called = [("write", "a"), ("sql", "CALL commits_part()"), ("raise", "")]
    answer = consumer.process("m-1", called)
    if consumer.store.engine.dialect.name == "postgresql":
        assert answer.verdict is Verdict.RETRY
        assert (noted(url), keys(url)) == ([], [])
    else:
        assert answer.verdict is Verdict.DEAD_LETTER
        assert answer.reason is not None
        assert str(answer.reason["x-inbox-error"]).startswith("TransactionEnded")
        assert (noted(url), keys(url)) == (["a", "proc"], ["m-1"])
        assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.DEAD_LETTER
        assert noted(url) == ["a", "proc"]


# A database -> the inbox's table named as the lexer once missed it.
HIDDEN_NAMES = {
    "sqlite": ["'inbox_received'", "[main].[inbox_received]"],
    "postgresql": ['U&"inbox\\005freceived"', "U&\"inbox!005freceived\" UESCAPE '!'"],
}


@pytest.mark.databases("sqlite", "postgresql")
def test_the_inboxs_table_is_refused_however_its_name_is_quoted(
    consumer: Consumer, url: str
) -> None:
    """A handler that deleted a processed message's key had that message run again at its
    next delivery: a name quoted in a way the guard did not read passed."""
    assert consumer.process("m-0", [("write", "m-0")]).verdict is Verdict.ACK
    for n, name in enumerate(HIDDEN_NAMES[consumer.store.engine.dialect.name], 1):
        forget = [("write", "forgot"), ("sql", f"DELETE FROM {name} WHERE message_id = 'm-0'")]
        assert consumer.process(f"m-{n}", forget).verdict is Verdict.RETRY
        assert consumer.process("m-0", [("write", "again")], redelivered=True).verdict is (
            Verdict.ACK
        )
    assert (noted(url), keys(url)) == (["m-0"], ["m-0"])


# A database -> its name for the inbox's own table, past any table of the session's.
OWN_SCHEMA = {"sqlite": "main", "postgresql": "public"}


@pytest.mark.databases("sqlite", "postgresql")
def test_a_temporary_table_of_the_inboxs_name_is_not_its_key(consumer: Consumer, url: str) -> None:
    """A temporary table comes first in every name's resolution: one made through the
    driver with the key's row copied in, the real row deleted, was what the inbox's look at
    its key found, and the message was acked with its key not committed; its redelivery ran
    the handler again (an outside review)."""
    schema = OWN_SCHEMA[consumer.store.engine.dialect.name]
    shadowed = [
        ("write", "a"),
        ("cursor", f"CREATE TEMP TABLE inbox_received AS SELECT * FROM {schema}.inbox_received"),
        ("cursor", f"DELETE FROM {schema}.inbox_received"),
    ]
    assert consumer.process("m-1", shadowed).verdict is Verdict.RETRY
    assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.ACK
    assert (noted(url), keys(url)) == (["done"], ["m-1"])


@pytest.mark.databases("postgresql")
def test_code_that_names_the_inboxs_table_is_refused(consumer: Consumer, url: str) -> None:
    """A deferred trigger runs at the COMMIT, after the inbox's look at its key: one a
    handler made, whose body deleted the inbox's keys, acked that message and every later
    one with its key not committed (an outside review). A dollar-quoted body is read for
    the inbox's names."""
    forget = [
        (
            "sql",
            "CREATE FUNCTION forget() RETURNS trigger LANGUAGE plpgsql AS "
            "$body$ BEGIN DELETE FROM inbox_received; RETURN NULL; END $body$",
        ),
        (
            "sql",
            "CREATE CONSTRAINT TRIGGER forget AFTER INSERT ON effects "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION forget()",
        ),
        ("write", "m-1"),
    ]
    assert consumer.process("m-1", forget).verdict is Verdict.RETRY
    assert consumer.process("m-2", WRITE).verdict is Verdict.ACK
    assert consumer.process("m-2", WRITE, redelivered=True).verdict is Verdict.ACK
    assert (noted(url), keys(url)) == (["done"], ["m-2"])


@pytest.mark.databases("sqlite")
def test_a_handler_may_create_a_trigger_in_its_transaction(consumer: Consumer, url: str) -> None:
    """SQLite's trigger is one statement: its body's ``END`` was read as a COMMIT, and a
    handler creating one was refused at every delivery."""
    trigger = (
        "CREATE TRIGGER copied AFTER INSERT ON effects BEGIN "
        "INSERT INTO effects (note) SELECT new.note || '-copy' "
        "WHERE new.note NOT LIKE '%-copy'; END"
    )
    steps = [("sql", trigger), ("write", "m-1")]
    assert consumer.process("m-1", steps).verdict is Verdict.ACK
    assert noted(url) == ["m-1", "m-1-copy"]


@pytest.mark.databases("mariadb")
@pytest.mark.parametrize(
    "text",
    [
        "CREATE TABLE side (a int)",
        "LOCK TABLES effects WRITE",
        "/*!50000 COMMIT */",
        "REPEAT COMMIT; UNTIL 1 END REPEAT",  # MariaDB runs it outside any procedure
    ],
)
def test_mysqls_implicit_commits_are_refused(consumer: Consumer, url: str, text: str) -> None:
    assert consumer.process("m-1", [("write", "a"), ("sql", text)]).verdict is Verdict.RETRY
    assert noted(url) == []
    assert keys(url) == []


def test_a_transaction_aborted_under_the_handler_is_a_failure_not_an_ack(
    consumer: Consumer, url: str
) -> None:
    """A handler that swallowed a database error and returned: on PostgreSQL its transaction
    can only roll back (a commit there is a silent rollback: the message would be acked and
    lost); elsewhere it commits what it wrote."""
    answer = consumer.process("m-1", [("write", "a"), ("swallow", "")])
    if consumer.store.engine.dialect.name == "postgresql":
        assert answer.verdict is Verdict.RETRY
        assert (noted(url), keys(url)) == ([], [])
    else:
        assert answer.verdict is Verdict.ACK
        assert (noted(url), keys(url)) == (["a"], ["m-1"])


@pytest.mark.databases("postgresql")
def test_a_failure_at_the_commit_is_the_messages_counted_to_its_dead_letter(
    consumer: Consumer, url: str
) -> None:
    """A deferred constraint that fails at the commit: counted like a handler's failure (not
    taken for the database away, which would run it again and again uncounted)."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE parents (id int PRIMARY KEY)"))
        conn.execute(
            sa.text(
                "CREATE TABLE children (parent int REFERENCES parents DEFERRABLE INITIALLY "
                "DEFERRED)"
            )
        )
    engine.dispose()
    orphan = [("sql", "INSERT INTO children VALUES (42)")]
    verdicts = [consumer.process("m-1", orphan, redelivered=n > 0).verdict for n in range(3)]
    assert verdicts == [Verdict.RETRY, Verdict.DELAY, Verdict.DEAD_LETTER]
    (row,) = attempts(url)
    assert row[1] == 3
    assert "IntegrityError" in row[2]
    assert "SQLSTATE 23503" in row[2]


def test_nothing_recorded_of_a_failure_quotes_a_value(consumer: Consumer, url: str) -> None:
    """The database's message (PostgreSQL's DETAIL, MySQL's "Duplicate entry"), SQLAlchemy's
    parameters, and the handler's own message: none of them in the attempts or the dead
    letter."""
    for n in range(3):
        answer = consumer.process("m-1", [("duplicate", "a")], redelivered=n > 0)
    assert answer.verdict is Verdict.DEAD_LETTER
    assert answer.reason is not None
    (row,) = attempts(url)
    for recorded in (row[2], str(answer.reason)):
        assert "IntegrityError" in recorded
        assert SECRET not in recorded
        assert "parameters" not in recorded
    answer = consumer.process("m-2", [("raise", "")])
    assert SECRET not in attempts(url)[1][2]
    assert "Failed at tests.support.inbox_script" in attempts(url)[1][2]


def test_only_a_run_that_died_inside_its_handler_is_counted(consumer: Consumer, url: str) -> None:
    """A delivery that comes again marks its run; the next one counts it only if the mark is
    still there. A run that committed, a duplicate, and deliveries that never reached a
    handler count nothing; a message processed is acked however its run was marked."""
    assert consumer.statement("start_run", "m-1") == 0  # came again: marked, nothing counted
    assert consumer.statement("start_run", "m-1") == 1  # the mark was there: it died inside
    consumer.statement("end_run", "m-1")  # this run ended without dying (the database away)
    assert consumer.process("m-1", [("raise", "")], redelivered=True).verdict is Verdict.DELAY
    assert [(row[1], row[3]) for row in attempts(url)] == [(2, False)]  # the count ended it
    assert consumer.statement("count_attempt", "m-1", "ValueError") == 3
    assert consumer.process("m-2", WRITE, redelivered=True).verdict is Verdict.ACK
    assert consumer.process("m-2", WRITE, redelivered=True).verdict is Verdict.ACK
    assert consumer.statement("start_run", "m-2") is None  # processed: not marked, not counted
    assert [(row[0], row[1], row[3]) for row in attempts(url)] == [
        ("m-1", 3, False),
        ("m-2", 0, False),
    ]
    failures = consumer.statement("failures", "m-1")
    assert (failures.attempts, failures.last_error) == (3, "ValueError")
    assert failures.first_failed_at <= failures.last_failed_at
    assert consumer.statement("failures", "m-3") is None


def test_a_processed_message_whose_ack_was_lost_is_never_dead_lettered(
    consumer: Consumer, url: str
) -> None:
    """It failed twice, then ran and committed; its ack lost, it comes again, and again: acked
    as processed each time, its handler not run, nothing counted (the allowance is 3)."""
    fail, done = [("raise", "")], [("write", "done")]
    assert consumer.process("m-1", fail).verdict is Verdict.RETRY
    assert consumer.process("m-1", fail, redelivered=True).verdict is Verdict.DELAY
    assert consumer.process("m-1", done, redelivered=True).verdict is Verdict.ACK
    for _ in range(3):
        assert consumer.process("m-1", [("write", "again")], redelivered=True).verdict is (
            Verdict.ACK
        )
    assert noted(url) == ["done"]
    assert [row[1] for row in attempts(url)] == [2]


def test_the_purge_deletes_expired_keys_in_chunks_and_nothing_else(url: str) -> None:
    """The purge's statements are the blocking store's, which the asyncio one runs too."""
    old = datetime.now(UTC) - timedelta(days=2)
    consumer = Consumer("blocking", url)
    store: InboxStore = consumer.store
    with store.engine.begin() as conn:
        for name in ("billing", "audit"):
            conn.execute(
                inbox_received.insert(),
                [
                    {"consumer": name, "message_id": f"old-{n}", "received_at": old}
                    for n in range(25)
                ],
            )
        conn.execute(
            inbox_attempts.insert(),
            [{"consumer": "billing", "message_id": "old-0", "attempts": 2, "updated_at": old}],
        )
    assert consumer.process("new", WRITE).verdict is Verdict.ACK
    assert store.purge(86400.0, chunk=10) == 26
    with store.engine.connect() as conn:
        left = conn.execute(sa.select(inbox_received.c.consumer, inbox_received.c.message_id))
        assert sorted(left) == sorted(
            [("billing", "new"), *[("audit", f"old-{n}") for n in range(25)]]
        )
        assert conn.scalar(sa.select(sa.func.count()).select_from(inbox_attempts)) == 0
    assert store.purge(86400.0, chunk=10) == 0
    consumer.close()


def test_a_consumer_with_the_consumer_roles_grants_does_all_it_does(
    postgres: PostgresServer, postgresql_url: str, kind: str
) -> None:
    """Keys, marks, attempts, the look for a committed key and the purge with exactly the
    grants ``relay.db.roles`` gives the consumer role (and its handler's own table)."""
    name, password = f"r_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    database = sa.make_url(postgresql_url).database or ""
    engine = create_engine(postgresql_url)
    effects.create(engine)
    engine.dispose()
    postgres.psql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    statements = [*grants("postgresql", CONSUMER, name), f"GRANT INSERT ON effects TO {name}"]
    postgres.psql("; ".join(statements), database=database)
    url = sa.make_url(postgresql_url).set(username=name, password=password)
    consumer = Consumer(kind, url.render_as_string(hide_password=False))
    try:
        assert consumer.process("m-1", WRITE).verdict is Verdict.ACK
        assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.ACK
        assert consumer.process("m-2", [("raise", "")], redelivered=True).verdict is Verdict.RETRY
        assert consumer.statement("purge_one", 0.0, 10) == 2
    finally:
        consumer.close()


@pytest.mark.databases("postgresql")
def test_the_inboxs_sessions_are_durable_and_bounded_whatever_the_servers_default(
    consumer: Consumer, postgres: PostgresServer, url: str, kind: str
) -> None:
    database = sa.make_url(url).database
    postgres.psql(f"ALTER DATABASE {database} SET synchronous_commit = off")
    fresh = Consumer(kind, url)
    shown = [
        ("sql", "INSERT INTO effects (note) SELECT current_setting('synchronous_commit')"),
        ("sql", "INSERT INTO effects (note) SELECT current_setting('lock_timeout')"),
        ("sql", "INSERT INTO effects (note) SELECT current_setting('statement_timeout')"),
    ]
    try:
        assert fresh.process("m-1", shown).verdict is Verdict.ACK
        assert fresh.statement("durability") is None
    finally:
        fresh.close()
    assert noted(url) == ["30s", "5s", "on"]


# What a thread or a task a handler left running sends through ``tx`` once it returned.
LATE = {
    "a failing statement": "SELECT * FROM no_such_table",
    "a rollback": "ROLLBACK",
    "a write": "INSERT INTO effects (note) VALUES ('late')",
}


@pytest.fixture
def late() -> Iterator[list[Exception | None]]:
    inbox_script.LATE.clear()
    yield inbox_script.LATE
    inbox_script.CALLS.pop("later", None)
    inbox_script.LATE.clear()


@pytest.mark.parametrize("sql", LATE.values(), ids=list(LATE))
def test_tx_used_after_the_handler_returned_is_refused_and_the_message_commits(
    consumer: Consumer,
    url: str,
    sql: str,
    late: list[Exception | None],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A thread or a task the handler left running sends through ``tx`` between the inbox's
    look at its key and its commit (a task at the inbox's first await; a thread held until
    the look is done): refused, nothing sent, and the message commits with all the handler
    did in its run. Sent, a failing statement aborted PostgreSQL's transaction (its COMMIT
    a rollback) and a ROLLBACK ended it: acked with nothing committed."""
    if consumer.kind == "blocking":
        checked = threading.Event()

        def hold() -> None:  # the thread's statement once the inbox looked at its key
            checked.wait(HANG_S)

        inbox_script.CALLS["later"] = hold
        look = consumer.store.statements.holds_key

        def holds_key(conn: sa.Connection, message_id: str) -> bool:
            held = bool(look(conn, message_id))
            checked.set()
            wait_until(lambda: bool(late), HANG_S, "the thread's statement")
            return held

        monkeypatch.setattr(consumer.store.statements, "holds_key", holds_key)
    answer = consumer.process("m-1", [("write", "a"), ("later", sql)])
    if consumer.kind == "asyncio":
        consumer.loop.run_until_complete(asyncio.sleep(0))
    assert answer.verdict is Verdict.ACK
    assert (noted(url), keys(url)) == (["a"], ["m-1"])
    ((refused,),) = [late]
    assert isinstance(refused, TransactionEnded)
    assert "the handler's run is over" in str(refused)


@pytest.mark.databases("postgresql")
def test_a_driver_rollback_between_the_look_and_the_commit_is_no_ack(
    consumer: Consumer, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A thread or a task the handler left running rolls back through the driver between
    the inbox's look at its key and its commit: the COMMIT began and committed an empty
    transaction, and the message was acked without its work (an outside review, review77).
    The COMMIT goes in one message with a check that the transaction is still the key's:
    refused there, the run failed, nothing committed, retried: its effect once."""
    look = consumer.store.statements.holds_key

    def holds_key(conn: sa.Connection, message_id: str) -> bool:
        held = bool(look(conn, message_id))
        driver: Any = conn.connection.driver_connection
        rolled_back = driver.rollback()
        if inspect.isawaitable(rolled_back):  # psycopg's asyncio connection, under run_sync
            await_only(rolled_back)
        return held

    monkeypatch.setattr(consumer.store.statements, "holds_key", holds_key)
    assert consumer.process("m-1", [("write", "a")]).verdict is Verdict.RETRY
    monkeypatch.undo()
    assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.ACK
    assert (noted(url), keys(url)) == (["done"], ["m-1"])


def test_tx_used_after_the_run_ended_says_so(consumer: Consumer, url: str) -> None:
    """``tx`` kept past the run (its connection the pool's, another message's): a clear
    error, nothing sent."""
    inbox_script.KEPT.clear()
    assert consumer.process("m-1", [("write", "a"), ("keep", "")]).verdict is Verdict.ACK
    (tx,) = inbox_script.KEPT
    inbox_script.KEPT.clear()
    with pytest.raises(TransactionEnded, match="the handler's run is over"):
        if consumer.kind == "blocking":
            tx.execute(effects.insert(), {"note": "b"})
        else:
            consumer.loop.run_until_complete(tx.execute(effects.insert(), {"note": "b"}))
    assert noted(url) == ["a"]


@pytest.mark.databases("postgresql")
def test_a_commit_that_rolled_back_is_a_failure_not_an_ack(
    consumer: Consumer, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A statement through the driver's own cursor, past the guard, that fails after the
    inbox's look at its key (a thread the handler left, say): PostgreSQL answers the COMMIT
    of the transaction it aborted with ROLLBACK and raises nothing. The COMMIT's status is
    read: the message's failure, counted, retried, not an ack with nothing committed."""
    look = consumer.store.statements.holds_key

    def holds_key(conn: sa.Connection, message_id: str) -> bool:
        held = bool(look(conn, message_id))
        with contextlib.suppress(sa.exc.DBAPIError):
            conn.exec_driver_sql("SELECT * FROM no_such_table")
        return held

    monkeypatch.setattr(consumer.store.statements, "holds_key", holds_key)
    assert consumer.process("m-1", [("write", "a")]).verdict is Verdict.RETRY
    ((_key, counted, error, _running),) = attempts(url)
    assert (counted, error.startswith("TransactionFailed")) == (1, True)
    monkeypatch.undo()
    assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.ACK
    assert (noted(url), keys(url)) == (["done"], ["m-1"])


# A handler's ways to have its transaction's commit not durable on PostgreSQL, none refused.
NOT_DURABLE = (
    "SET LOCAL synchronous_commit = off",
    "SELECT set_config('synchronous_commit', 'off', true)",
    "DO $$ BEGIN SET LOCAL synchronous_commit = off; END $$",
)


@pytest.mark.databases("postgresql")
@pytest.mark.parametrize("spelling", NOT_DURABLE)
def test_a_handler_cannot_make_its_messages_commit_not_durable(
    consumer: Consumer, url: str, spelling: str
) -> None:
    """A handler set ``synchronous_commit`` off for its transaction: the message was acked
    after a commit that a crash of the server right after undid, key and effect. The inbox
    sets it on again in its last look before the commit; a deferred trigger, run at the
    commit, notes the setting the commit was made with."""
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION note_commit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "INSERT INTO effects (note) VALUES (current_setting('synchronous_commit')); "
            "RETURN NULL; END $$"
        )
        conn.exec_driver_sql(
            "CREATE CONSTRAINT TRIGGER at_commit AFTER INSERT ON effects "
            "DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (NEW.note = 'committed with') "
            "EXECUTE FUNCTION note_commit()"
        )
    engine.dispose()
    script = [("sql", spelling), ("write", "committed with")]
    assert consumer.process("m-1", script).verdict is Verdict.ACK
    assert noted(url) == ["committed with", "on"]


def test_a_connection_left_in_autocommit_is_not_used_again(consumer: Consumer, url: str) -> None:
    """A handler turned autocommit on through the driver and went on (its work committed
    with its key): the connection is discarded, and the next message, on the pool's next
    connection, is all or nothing again (it was committed a statement at a time)."""
    after = [("write", "door"), ("autocommit", ""), ("write", "after")]
    # Where the driver says no transaction is open (sqlite3 commits as its autocommit goes
    # on, PostgreSQL's is committed first), the write after is refused: the message's
    # last part is "door". MariaDB runs it, committed: its key's transaction is over, and
    # the key committed cannot be told from another delivery's (``MySQL.key_marked``).
    refused = consumer.store.engine.dialect.name in ("sqlite", "postgresql")
    assert consumer.process("m-1", after).verdict is Verdict.DEAD_LETTER
    innocent = [("write", "innocent"), ("raise", "")]
    assert consumer.process("m-2", innocent).verdict is Verdict.RETRY
    assert noted(url) == (["door"] if refused else ["after", "door"])
    assert keys(url) == ["m-1"]


@pytest.mark.databases("postgresql")
def test_a_setting_that_would_outlive_the_message_is_refused(consumer: Consumer, url: str) -> None:
    """``SET`` (not ``SET LOCAL``) would stay on the pooled connection for the messages after
    it: refused, a failure; ``SET LOCAL`` lasts the transaction, and is allowed."""
    session = [("write", "a"), ("sql", "SET synchronous_commit = off")]
    assert consumer.process("m-1", session).verdict is Verdict.RETRY
    local = [("sql", "SET LOCAL synchronous_commit = off"), ("write", "b")]
    assert consumer.process("m-2", local).verdict is Verdict.ACK
    assert noted(url) == ["b"]


SYNCHRONOUS_COMMIT = (
    "sql",
    "INSERT INTO effects (note) SELECT current_setting('synchronous_commit')",
)
# A session's state a handler can leave on its pooled connection without a statement the
# guard refuses -> (what the handler runs, what the next message's handler runs, the notes)
LEFT_IN_THE_SESSION: dict[str, tuple[str, Action, list[str]]] = {
    "set_config": (
        "SELECT set_config('lock_timeout', '1s', false)",
        ("sql", "INSERT INTO effects (note) SELECT current_setting('lock_timeout')"),
        ["5s"],
    ),
    "a DO block's SET": (
        "DO $$ BEGIN SET synchronous_commit = off; END $$",
        SYNCHRONOUS_COMMIT,
        ["on"],
    ),
    "read-only transactions": (
        "SELECT set_config('default_transaction_read_only', 'on', false)",
        ("write", "next"),
        ["next"],
    ),
    "a temporary table": (
        "CREATE TEMP TABLE scratch (a int)",
        ("sql", "CREATE TEMP TABLE scratch (a int)"),
        [],
    ),
    "a prepared statement": (
        "PREPARE totals AS SELECT 1",
        ("sql", "PREPARE totals AS SELECT 1"),
        [],
    ),
}


@pytest.mark.databases("postgresql")
@pytest.mark.parametrize("left", LEFT_IN_THE_SESSION)
def test_a_session_left_changed_is_not_the_next_messages(
    consumer: Consumer, url: str, left: str
) -> None:
    """What a handler's run leaves in its connection's session past the guard (a function
    or a block that sets a setting for the session, a temporary table, a prepared
    statement) stays on the pooled connection: the next message ran durable-less, paused for
    ever on a read-only session as if the database were away, or failed on a name taken."""
    change, probe, notes = LEFT_IN_THE_SESSION[left]
    assert consumer.process("m-1", [("sql", change)]).verdict is Verdict.ACK
    answer = consumer.process("m-2", [probe])
    assert (answer.verdict, answer.pause) == (Verdict.ACK, False)
    assert noted(url) == notes


@pytest.mark.databases("postgresql", "mariadb")
def test_the_database_lost_as_the_handler_raises_is_the_database_away(
    kind: str, url: str, tmp_path: Path
) -> None:
    """The handler raised, and the database went away before the inbox could look for the
    key: the delivery is requeued uncounted (the consumer pauses), and nothing raises out
    of the inbox; once the database answers, the message is processed."""
    cut = tmp_path / "cut"
    server = sa.make_url(url)
    assert server.port is not None
    with TcpProxy(server.port, cut=cut, refuse_after_cut=1.0) as proxy:
        through = server.set(port=proxy.port).render_as_string(hide_password=False)
        consumer = Consumer(kind, through)
        try:
            raised = [("write", "a"), ("touch", str(cut)), ("raise", "")]
            answer = consumer.process("m-1", raised)
            assert (answer.verdict, answer.pause) == (Verdict.RETRY, True)
            assert proxy.cuts == 1
            wait_until(lambda: answers(consumer), 30, "the database answering again")
            assert consumer.process("m-1", WRITE, redelivered=True).verdict is Verdict.ACK
        finally:
            consumer.close()
    assert (noted(url), [row[1] for row in attempts(url)]) == (["done"], [0])


def run_lock_asked(monkeypatch: pytest.MonkeyPatch, thread: threading.Thread) -> threading.Event:
    """Set once ``thread`` asks for a run lock (``relay.db.runlock``: its ``flock``, blocking
    or tried without blocking)."""
    asked = threading.Event()
    flock = fcntl.flock

    def spied(fd: int, operation: int) -> None:
        if threading.current_thread() is thread and operation & fcntl.LOCK_EX:
            asked.set()
        flock(fd, operation)

    spy = SimpleNamespace(
        flock=spied, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB, LOCK_UN=fcntl.LOCK_UN
    )
    monkeypatch.setattr(runlock, "fcntl", spy)
    return asked


def answers(consumer: Consumer) -> bool:
    try:
        consumer.statement("ping")
    except StoreError:
        return False
    return True


def test_a_live_run_is_never_counted_as_one_that_died(
    url: str, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two consumers of one name with one message (redelivered to the second while the first
    still works on it, after a lost connection or a replay): the second waits for the
    first's run (its key, or on SQLite the run lock) and finds it processed; it never takes
    the first's mark for a run that died."""
    first, second = Consumer(kind, url), Consumer(kind, url)
    inside = threading.Event()
    seen: list[Answer] = []
    held: list[bool] = []

    def again() -> None:
        assert inside.wait(HANG_S)
        seen.append(second.process("m-1", [("write", "twice")], redelivered=True))

    thread = threading.Thread(target=again)
    asked = run_lock_asked(monkeypatch, thread)
    sql = LOCK_WAITS.get(sa.make_url(url).get_backend_name())
    look = sa.create_engine(url)

    def waiting() -> bool:
        """The second's run waits on the first's: on its key (the server shows the lock
        wait), or on SQLite it asked for the run lock the first holds."""
        if sql is None:
            return asked.is_set()
        with look.connect() as conn:
            return int(conn.execute(sa.text(sql)).scalar_one()) > 0

    def hold() -> None:
        inside.set()
        # Held until the second's run has reached the first's key (or the run lock): a run
        # that marked the message and counted a crash before its key would have done so.
        wait_until(
            waiting,
            HANG_S,
            "the second consumer's run waiting on the first's",
            poll=LOCK_WAITS_POLL_S,
        )
        held.append(True)

    inbox_script.CALLS["hold"] = hold
    thread.start()
    try:
        slow = [("write", "once"), ("call", "hold")]
        answer = first.process("m-1", slow, redelivered=True)
        assert held, "the second consumer's run was never seen waiting on the first's"
        assert answer.verdict is Verdict.ACK
        thread.join(HANG_S)
        assert [answer.verdict for answer in seen] == [Verdict.ACK]
    finally:
        thread.join(HANG_S)
        first.close()
        second.close()
        look.dispose()
    assert noted(url) == ["once"]
    assert [(row[1], row[3]) for row in attempts(url)] == [(0, False)]


def test_another_tasks_commit_during_the_inboxs_savepoint_is_refused(url: str) -> None:
    """An asyncio handler's two tasks on its transaction: while one awaits ``tx.savepoint()``'s
    SAVEPOINT (the inbox's own, let through), the other's COMMIT was let through with it,
    committing the key with a part of the work."""
    consumer = Consumer("asyncio", url)
    refused: list[TransactionEnded] = []

    async def handler(tx: AsyncTransaction) -> None:
        await tx.execute(effects.insert(), {"note": "a"})

        async def part() -> None:
            async with tx.savepoint():
                await tx.execute(effects.insert(), {"note": "part"})

        async def commit() -> None:
            try:
                await tx.execute("COMMIT")
            except TransactionEnded as exc:
                refused.append(exc)

        await asyncio.gather(part(), commit(), return_exceptions=True)

    async def process() -> Answer:
        delivery = Delivery("m-1", b"{}", "x", "k", None, {}, False)
        async with consumer.store.message(handler) as run:
            return await drive_async(consumer.flow.process(delivery), run)

    try:
        answer = consumer.loop.run_until_complete(process())
    finally:
        consumer.close()
    assert (answer.verdict, len(refused)) == (Verdict.RETRY, 1)
    assert (noted(url), keys(url)) == ([], [])


@pytest.mark.databases("sqlite", "mariadb")
def test_a_connection_a_handler_left_read_only_is_discarded_at_the_next_key(
    consumer: Consumer, url: str
) -> None:
    """A handler makes its connection read-only through the driver and returns: acked. The
    next message's key insert on that pooled connection fails: taken for the database away
    (uncounted), it was requeued with the same connection pooled again, for ever (an outside
    review, review79's d6). The connection is discarded there: the next delivery runs."""
    statement = (
        "PRAGMA query_only = 1"
        if consumer.store.engine.dialect.name == "sqlite"
        else "SET SESSION TRANSACTION READ ONLY"
    )
    assert consumer.process("m-1", [("write", "a"), ("cursor", statement)]).verdict is Verdict.ACK
    away = consumer.process("m-2", WRITE)
    assert (away.verdict, away.pause) == (Verdict.RETRY, True)
    assert consumer.process("m-2", WRITE, redelivered=True).verdict is Verdict.ACK
    assert (noted(url), keys(url)) == (["a", "done"], ["m-1", "m-2"])
