"""The inbox's database side (``relay.db.inbox``) on SQLite, PostgreSQL and MariaDB: a key
goes in once, with the writes of its transaction or not at all; a second delivery of a
message under way waits for the first and finds it; attempts and purges per consumer."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa

from devtools.servers import PostgresServer
from relay.db.inbox import InboxStore, TransactionEnded
from relay.db.roles import CONSUMER, grants
from relay.db.schema import inbox_attempts, inbox_received

effects = sa.Table("effects", sa.MetaData(), sa.Column("note", sa.String(64)))


@pytest.fixture
def store(database_url: str) -> Iterator[InboxStore]:
    inbox = InboxStore(database_url, "billing")
    effects.create(inbox.engine)
    yield inbox
    inbox.close()


def noted(store: InboxStore) -> list[str]:
    with store.engine.connect() as conn:
        return sorted(conn.scalars(sa.select(effects.c.note)))


def test_a_key_goes_in_once_with_its_transactions_writes(store: InboxStore) -> None:
    with store.receive("m-1") as tx:
        assert tx is not None
        tx.execute(effects.insert(), {"note": "first"})
    with store.receive("m-1") as tx:
        assert tx is None
    with pytest.raises(RuntimeError), store.receive("m-2") as tx:
        assert tx is not None
        tx.execute(effects.insert(), {"note": "rolled back"})
        raise RuntimeError("the handler failed")
    with store.receive("m-2") as tx:  # its key went with the rollback: not a duplicate
        assert tx is not None
        tx.execute(effects.insert(), {"note": "second"})
    assert noted(store) == ["first", "second"]


def test_consumers_keep_their_own_keys(store: InboxStore, database_url: str) -> None:
    other = InboxStore(database_url, "audit")
    try:
        for inbox in (store, other):
            with inbox.receive("m-1") as tx:
                assert tx is not None
        assert other.count_attempt("m-2", "boom") == 1
        assert store.attempts("m-2") == 0
    finally:
        other.close()


def test_a_second_delivery_waits_for_the_first_and_finds_it(
    store: InboxStore, database_url: str
) -> None:
    """Two consumers of one name with the same message (redelivered after a lost connection):
    the second's insert waits on the first's uncommitted key, then sees it committed."""
    twin = InboxStore(database_url, "billing")
    inserted = threading.Event()
    second: list[object] = []

    def redelivered() -> None:
        inserted.wait(10)
        with twin.receive("m-1") as tx:
            second.append(tx)

    thread = threading.Thread(target=redelivered)
    thread.start()
    try:
        with store.receive("m-1") as tx:
            assert tx is not None
            tx.execute(effects.insert(), {"note": "once"})
            inserted.set()
            time.sleep(0.5)
            assert second == []  # still waiting on the first one's key
        thread.join(30)
        assert second == [None]
        assert noted(store) == ["once"]
    finally:
        thread.join(30)
        twin.close()


def test_attempts_are_counted_in_transactions_of_their_own(store: InboxStore) -> None:
    with pytest.raises(RuntimeError), store.receive("m-1") as tx:
        assert tx is not None
        assert store.attempts("m-1") == 0
        raise RuntimeError
    assert [store.count_attempt("m-1", f"failure {n}") for n in range(3)] == [1, 2, 3]
    with store.engine.connect() as conn:
        row = conn.execute(sa.select(inbox_attempts)).one()
    assert (row.consumer, row.attempts, row.last_error) == ("billing", 3, "failure 2")


def test_the_purge_deletes_expired_keys_in_chunks_and_nothing_else(
    store: InboxStore, database_url: str
) -> None:
    old = datetime.now(UTC) - timedelta(days=2)
    with store.engine.begin() as conn:
        for consumer in ("billing", "audit"):
            conn.execute(
                inbox_received.insert(),
                [
                    {"consumer": consumer, "message_id": f"old-{n}", "received_at": old}
                    for n in range(25)
                ],
            )
        conn.execute(
            inbox_attempts.insert(),
            [{"consumer": "billing", "message_id": "old-0", "attempts": 2, "updated_at": old}],
        )
    with store.receive("new") as tx:
        assert tx is not None
    assert store.purge(86400.0, chunk=10) == 26
    with store.engine.connect() as conn:
        left = conn.execute(sa.select(inbox_received.c.consumer, inbox_received.c.message_id))
        assert sorted(left) == sorted(
            [("billing", "new"), *[("audit", f"old-{n}") for n in range(25)]]
        )
        assert conn.scalar(sa.select(sa.func.count()).select_from(inbox_attempts)) == 0
    assert store.purge(86400.0, chunk=10) == 0


def test_a_consumer_with_the_consumer_roles_grants_does_all_it_does(
    postgres: PostgresServer, postgresql_url: str
) -> None:
    """Keys, attempts and the purge with exactly the grants ``relay.db.roles`` gives the
    consumer role (and INSERT on its handler's own table)."""
    name, password = f"r_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    database = sa.make_url(postgresql_url).database or ""
    owner = InboxStore(postgresql_url, "owner")
    effects.create(owner.engine)
    owner.close()
    postgres.psql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    statements = [*grants("postgresql", CONSUMER, name), f"GRANT INSERT ON effects TO {name}"]
    postgres.psql("; ".join(statements), database=database)
    url = sa.make_url(postgresql_url).set(username=name, password=password)
    store = InboxStore(url.render_as_string(hide_password=False), "billing")
    try:
        with store.receive("m-1") as tx:
            assert tx is not None
            tx.execute(effects.insert(), {"note": "done"})
        with store.receive("m-1") as tx:
            assert tx is None
        assert store.count_attempt("m-2", "boom") == 1
        assert store.purge(0.0, chunk=10) == 2
    finally:
        store.close()


def test_only_a_run_that_died_inside_its_handler_is_counted(store: InboxStore) -> None:
    """A delivery that comes again marks its run; the next one counts it only if the mark is
    still there. A run that ended without a failure (the database failed around it) and
    deliveries that never reached a handler count nothing."""
    assert store.start_run("m-1") == 0  # came again: marked, nothing counted
    store.end_run("m-1")  # say, the key's insert timed out: not the handler's doing
    assert store.start_run("m-1") == 0
    assert store.start_run("m-1") == 1  # the last run's mark was there: it died in the handler
    assert store.count_attempt("m-1", "ValueError: no") == 2  # a handler that raised
    assert store.start_run("m-1") == 2  # its run was over: not counted again
    failures = store.failures("m-1")
    assert failures is not None
    assert (failures.attempts, failures.last_error) == (2, "ValueError: no")
    assert failures.first_failed_at is not None and failures.last_failed_at is not None
    assert failures.first_failed_at <= failures.last_failed_at
    assert store.failures("m-2") is None


def test_the_handlers_transaction_cannot_be_ended_by_the_handler(store: InboxStore) -> None:
    """``commit``, ``rollback`` and ``close`` are not there; a transaction statement as SQL
    text is refused; a savepoint rolls back a part alone."""
    with pytest.raises(TransactionEnded), store.receive("m-1") as tx:
        assert tx is not None
        tx.execute(effects.insert(), {"note": "before"})
        for method in ("commit", "rollback", "close", "begin"):
            assert not hasattr(tx, method)
        with tx.savepoint():
            tx.execute(effects.insert(), {"note": "kept"})
        with contextlib.suppress(RuntimeError), tx.savepoint():
            tx.execute(effects.insert(), {"note": "undone"})
            raise RuntimeError("a part failed")
        assert tx.scalar(sa.select(sa.func.count()).select_from(effects)) == 2
        tx.execute("  commit")
    assert noted(store) == []  # the whole transaction rolled back, its key with it
    with store.receive("m-1") as tx:
        assert tx is not None
        tx.execute(effects.insert(), {"note": "again"})
    assert noted(store) == ["again"]


@pytest.mark.databases("postgresql", "sqlite")
def test_a_transaction_ended_through_the_driver_fails_and_forgets_its_key(
    store: InboxStore,
) -> None:
    """Past ``Transaction``, through the driver's own connection: found at the end (on
    PostgreSQL and SQLite the driver says so without a round trip)."""
    with pytest.raises(TransactionEnded), store.receive("m-1") as tx:
        assert tx is not None
        tx._conn.connection.dbapi_connection.commit()  # type: ignore[union-attr]
    store.forget("m-1")
    with store.receive("m-1") as tx:
        assert tx is not None


@pytest.mark.databases("postgresql")
def test_the_inboxs_commits_are_durable_whatever_the_servers_default(
    store: InboxStore, postgres: PostgresServer, database_url: str
) -> None:
    database = sa.make_url(database_url).database
    postgres.psql(f"ALTER DATABASE {database} SET synchronous_commit = off")
    fresh = InboxStore(database_url, "billing")
    try:
        with fresh.engine.connect() as conn:
            assert conn.scalar(sa.text("SHOW synchronous_commit")) == "on"
            # Bounded as the relay's: a lock wait or a statement that hangs fails.
            assert conn.scalar(sa.text("SHOW lock_timeout")) == "5s"
            assert conn.scalar(sa.text("SHOW statement_timeout")) == "30s"
        assert fresh.durability_problem() is None
    finally:
        fresh.close()
