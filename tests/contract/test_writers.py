"""What a writer sees, and what it may do, on every database: its INSERT is a plain INSERT.

- A message id sent before (in the sent log) and written again goes in like a new one, the
  other rows of its statement with it; the relay's claim drops it unpublished. Exact at READ
  COMMITTED, REPEATABLE READ and SERIALIZABLE (PostgreSQL, MariaDB; SQLite has one level):
  the writer's snapshot decides nothing, the relay's own statement does.
- With ``keep_sent = messages`` the sent row is still there: writing its id again is a
  duplicate key, as for an id still pending, on every database.
- A writer role with INSERT on the outbox and nothing else writes; the schema has no code
  that could run with another role's rights (no triggers, no definer-rights functions), and
  objects a writer makes in its temporary schema borrow none (PostgreSQL).
- The relay's store works with the relay role's grants and no more.

Each runs on a database made by the migrations, and on one upgraded from 0006 (the schema
with the dedupe and NOTIFY triggers).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from devtools.servers import MariaDBServer, PostgresServer
from relay.db.claims import ClaimStore
from relay.db.engine import create_engine
from relay.db.migrate import migrate
from relay.db.outbox import OutboxAdmin, OutboxWriter
from relay.db.roles import RELAY, WRITER, grants
from relay.db.schema import metadata, outbox
from relay.db.sink import OutboxSink
from relay.records import KEEP_MESSAGES, NewMessage, SettleBatch
from tests.support.privileges import definer_functions
from tests.support.rows import sink_chunk

NO_BYTE_LIMIT = 2**62
LEVELS = ("READ COMMITTED", "REPEATABLE READ", "SERIALIZABLE")
BEFORE_0007 = "0006"


MADE = ("fresh", "upgraded")


def _migrated(url: str, made: str) -> str:
    """``url``'s database migrated to the head (``fresh``), or to 0006 then to the head."""
    if made == "upgraded":
        migrate(url, BEFORE_0007)
    migrate(url)
    return url


def new_database(request: pytest.FixtureRequest, database: str, made: str) -> str:
    """A new database on ``database``'s server (the session's), migrated as ``made`` says."""
    name = f"w_{uuid.uuid4().hex[:12]}"
    if database == "sqlite":
        tmp_path: Path = request.getfixturevalue("tmp_path")
        return _migrated(f"sqlite:///{tmp_path / name}.db", made)
    server: PostgresServer | MariaDBServer = request.getfixturevalue(database)
    server.create_database(name)
    return _migrated(server.url(name), made)


@pytest.fixture(
    params=[f"{db}-{made}" for db in ("sqlite", "postgres", "mariadb") for made in MADE]
)
def url(request: pytest.FixtureRequest) -> str:
    database, made = str(request.param).split("-")
    return new_database(request, database, made)


@pytest.fixture(params=MADE)
def pg_url(request: pytest.FixtureRequest) -> str:
    return new_database(request, "postgres", str(request.param))


@pytest.fixture(params=[f"mariadb-{made}" for made in MADE])
def maria_url(request: pytest.FixtureRequest) -> str:
    return new_database(request, "mariadb", str(request.param).split("-")[1])


# Columns a writer's role may not give (relay.db.roles): an id ahead of the sequence would
# fail later writers' INSERTs, a row written as sent would never be published.
WHEN = datetime(2026, 1, 1, tzinfo=UTC)
NOT_A_WRITERS: dict[str, object] = {
    "id": 10**9,
    "status": "sent",
    "attempts": 7,
    "next_attempt_at": WHEN,
    "last_error": "x",
    "suspect": True,
}


def insert_with(column: str, value: object) -> tuple[sa.TextClause, dict[str, object]]:
    """A plain INSERT of one row giving ``column`` too (as SQL: SQLAlchemy's would read the
    new id back, which a writer may not)."""
    statement = f"INSERT INTO outbox (message_id, payload, {column}) VALUES ('w', 'x', :value)"
    return sa.text(statement), {"value": value}


def rows(*message_ids: str) -> list[dict[str, object]]:
    return [{"message_id": m, "exchange": "ex", "payload": b"body"} for m in message_ids]


def message_ids(engine: sa.Engine) -> list[str]:
    with engine.connect() as conn:
        return list(conn.scalars(sa.select(outbox.c.message_id).order_by(outbox.c.id)))


@pytest.fixture
def relay_store(url: str) -> Iterator[ClaimStore]:
    store = ClaimStore(url, "relay-1", 60.0)
    store.turn()
    yield store
    store.close()


def ack_all(store: ClaimStore) -> None:
    claimed = store.claim(1000, NO_BYTE_LIMIT)
    store.settle(SettleBatch(sent=tuple(r.id for r in claimed)))


def drop_duplicates(store: ClaimStore) -> list[str]:
    """Claim every due row, settle the duplicates among them (as the loop does: never
    published), and return the message ids a relay would publish."""
    claimed = store.claim(1000, NO_BYTE_LIMIT)
    store.settle(SettleBatch(duplicates=tuple(r.id for r in claimed if r.sent_before)))
    return [r.message_id for r in claimed if not r.sent_before]


def levels(url: str) -> tuple[str, ...]:
    return ("SERIALIZABLE",) if url.startswith("sqlite") else LEVELS


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.applies.with_args(lambda params: params["level"] in levels(params["url"]))
def test_a_writer_whose_snapshot_predates_the_ack_gets_no_second_publish(
    url: str, relay_store: ClaimStore, level: str
) -> None:
    """The writer's transaction reads (taking its snapshot) while the relay holds X, the
    relay acks X, the writer writes X again with two new ids in one statement and commits
    (on SQLite, its one isolation level)."""
    writer = create_engine(url)
    try:
        first = OutboxWriter(url)
        first.enqueue([NewMessage(b"x", "ex", message_id="X")])
        first.close()
        (held,) = relay_store.claim(10, NO_BYTE_LIMIT)
        # A read of a table takes the snapshot; SQLite's writer would then find it stale at
        # its INSERT and fail, so there the transaction reads no table.
        snapshot = (
            "SELECT 1" if url.startswith("sqlite") else "SELECT count(*) FROM outbox_counters"
        )
        with writer.execution_options(isolation_level=level).connect() as conn:
            conn.execute(sa.text(snapshot)).scalar()
            relay_store.settle(SettleBatch(sent=(held.id,)))
            written = conn.execute(
                sa.insert(outbox).values(rows("new-1", "X", "new-2")),
                execution_options={"preserve_rowcount": True},
            )
            assert written.rowcount == 3, "the INSERT wrote every row of its statement"
            conn.commit()
        assert message_ids(writer) == ["new-1", "X", "new-2"]
        assert drop_duplicates(relay_store) == ["new-1", "new-2"]
        assert message_ids(writer) == ["new-1", "new-2"]
        admin = OutboxAdmin(url)
        assert admin.status().duplicates == 1
        admin.close()
    finally:
        writer.dispose()


def test_every_writer_of_the_project_writes_a_sent_id_like_a_new_one(
    url: str, relay_store: ClaimStore
) -> None:
    """``relay enqueue``'s writer and the Spark writer's append: no lookup of their own, the
    same outcome as plain SQL."""
    writer, sink = OutboxWriter(url), OutboxSink(url)
    try:
        writer.enqueue([NewMessage(b"x", "ex", message_id=m) for m in ("a", "b")])
        ack_all(relay_store)
        writer.enqueue([NewMessage(b"x", "ex", message_id=m) for m in ("a", "c")])
        assert sink.append([sink_chunk(["b", "d", "c"])]) == (3, 2), "c is still pending"
        assert drop_duplicates(relay_store) == ["c", "d"]
        assert message_ids(writer.engine) == ["c", "d"]
    finally:
        writer.close()
        sink.close()


def test_with_sent_rows_kept_whole_a_sent_id_is_a_duplicate_key_everywhere(url: str) -> None:
    store = ClaimStore(url, "relay-1", 60.0, keep_sent=KEEP_MESSAGES)
    store.turn()
    writer = create_engine(url)
    try:
        with writer.begin() as conn:
            conn.execute(sa.insert(outbox).values(rows("sent", "pending")))
        (sent, _) = store.claim(10, NO_BYTE_LIMIT)
        store.settle(SettleBatch(sent=(sent.id,)))
        for again in ("sent", "pending"):
            with pytest.raises(sa.exc.IntegrityError), writer.begin() as conn:
                conn.execute(sa.insert(outbox).values(rows("new", again)))
        assert message_ids(writer) == ["sent", "pending"], "the failed statements wrote nothing"
    finally:
        writer.dispose()
        store.close()


def _login(postgres: PostgresServer, url: str, *roles: str) -> str:
    """A new PostgreSQL login with the grants of ``roles``; its URL."""
    name, password = f"r_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    database = sa.make_url(url).database or ""
    postgres.psql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    for role in roles:
        postgres.psql("; ".join(grants("postgresql", role, name)), database=database)
    return sa.make_url(url).set(username=name, password=password).render_as_string(False)


def _superuser(engine: sa.Engine, name: str) -> bool:
    with engine.connect() as conn:
        query = sa.text("SELECT rolsuper FROM pg_roles WHERE rolname = :name")
        return bool(conn.execute(query, {"name": name}).scalar_one())


def test_a_postgresql_writer_with_insert_only_writes_and_borrows_no_rights(
    postgres: PostgresServer, pg_url: str
) -> None:
    """The writer shadows every table of the schema but the outbox with a temporary view
    that would make it a superuser if anything ran it with more rights than its own (the
    attack on the SECURITY DEFINER trigger of 0004), then writes."""
    writer_url = _login(postgres, pg_url, WRITER)
    name = sa.make_url(writer_url).username or ""
    owner, writer = create_engine(pg_url), create_engine(writer_url)
    try:
        with owner.begin() as conn:
            conn.execute(sa.insert(outbox).values(rows("sent")))
        store = ClaimStore(pg_url, "relay-1", 60.0)
        store.turn()
        ack_all(store)
        with writer.begin() as conn:
            conn.execute(
                sa.text(
                    "CREATE FUNCTION pg_temp.promote() RETURNS text LANGUAGE plpgsql AS "
                    f"$$ BEGIN ALTER ROLE {name} SUPERUSER; RETURN NULL; END $$"
                )
            )
            # Every column is the function's (volatile) result: a constant would let the
            # planner fold a comparison with it away without running the view.
            for table in metadata.sorted_tables:
                if table.name == "outbox":
                    continue
                columns = ", ".join(
                    f"pg_temp.promote()::{c.type.compile(dialect=owner.dialect)} AS {c.name}"
                    for c in table.columns
                )
                conn.execute(sa.text(f"CREATE TEMP VIEW {table.name} AS SELECT {columns}"))
            written = conn.execute(
                sa.text(
                    "INSERT INTO public.outbox (message_id, exchange, payload) "
                    "VALUES ('one', 'ex', 'a'), ('sent', 'ex', 'b'), ('two', 'ex', 'c')"
                )
            )
            assert written.rowcount == 3
        assert not _superuser(owner, name)
        with owner.connect() as conn:
            definer = definer_functions(conn)
            triggers = conn.execute(
                sa.text("SELECT count(*) FROM pg_trigger WHERE NOT tgisinternal")
            ).scalar_one()
        assert (definer, triggers) == (0, 0)
        assert drop_duplicates(store) == ["one", "two"]
        store.close()
        with (
            pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
            writer.begin() as conn,
        ):
            conn.execute(sa.text("SELECT id FROM public.outbox"))
        for column, value in NOT_A_WRITERS.items():
            with (
                pytest.raises(sa.exc.ProgrammingError, match="permission denied"),
                writer.begin() as conn,
            ):
                conn.execute(*insert_with(column, value))
        with writer.begin() as conn:  # its own time it may give
            conn.execute(*insert_with("created_at", WHEN))
    finally:
        owner.dispose()
        writer.dispose()


def test_a_mariadb_writer_with_insert_only_writes_and_the_schema_has_no_code(
    mariadb: MariaDBServer, maria_url: str
) -> None:
    """A MariaDB trigger or routine always runs with its definer's rights: there are none."""
    database = sa.make_url(maria_url).database or ""
    name, password = f"w_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    mariadb.sql(f"CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'")
    for statement in grants("mysql", WRITER, f"'{name}'@'%'", database):
        mariadb.sql(statement)
    writer_url = sa.make_url(maria_url).set(username=name, password=password)
    writer = create_engine(writer_url.render_as_string(False))
    try:
        with writer.begin() as conn:
            written = conn.execute(
                sa.insert(outbox).values(rows("one", "two")),
                execution_options={"preserve_rowcount": True},
            )
            assert written.rowcount == 2
        with pytest.raises(sa.exc.OperationalError, match="denied"), writer.begin() as conn:
            conn.execute(sa.text("CREATE TEMPORARY TABLE outbox_sent_log (k int)"))
        for column, value in NOT_A_WRITERS.items():
            with pytest.raises(sa.exc.OperationalError, match="denied"), writer.begin() as conn:
                conn.execute(*insert_with(column, value))
        with writer.begin() as conn:
            conn.execute(*insert_with("created_at", WHEN))
        code = (
            f"SELECT (SELECT count(*) FROM information_schema.TRIGGERS"
            f" WHERE EVENT_OBJECT_SCHEMA = '{database}')"
            f" + (SELECT count(*) FROM information_schema.ROUTINES"
            f" WHERE ROUTINE_SCHEMA = '{database}')"
        )
        assert mariadb.sql(code).strip() == "0"
    finally:
        writer.dispose()


@pytest.mark.parametrize("made", MADE)
@pytest.mark.parametrize("database", ["postgres", "mariadb"])
def test_the_relays_store_works_with_the_relay_roles_grants_only(
    request: pytest.FixtureRequest, database: str, made: str
) -> None:
    """Turns, claims, acks, duplicates, status and the retention's purge, as the relay role."""
    owner_url = new_database(request, database, made)
    if database == "postgres":
        relay_url = _login(request.getfixturevalue("postgres"), owner_url, RELAY)
    else:
        mariadb: MariaDBServer = request.getfixturevalue("mariadb")
        name, password = f"r_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        mariadb.sql(f"CREATE USER '{name}'@'%' IDENTIFIED BY '{password}'")
        target = sa.make_url(owner_url)
        for statement in grants("mysql", RELAY, f"'{name}'@'%'", target.database or ""):
            mariadb.sql(statement)
        relay_url = target.set(username=name, password=password).render_as_string(False)
    writer = OutboxWriter(owner_url)
    store = ClaimStore(relay_url, "relay-1", 60.0)
    admin = OutboxAdmin(relay_url)
    try:
        writer.enqueue([NewMessage(b"x", "ex", message_id=m) for m in ("a", "b")])
        store.turn()
        ack_all(store)
        writer.enqueue([NewMessage(b"x", "ex", message_id=m) for m in ("a", "c")])
        assert drop_duplicates(store) == ["c"]
        status = admin.status()
        assert (status.counts["sent"], status.duplicates) == (2, 1)
        assert admin.purge(0.0) == 2
    finally:
        store.close()
        admin.close()
        writer.close()
