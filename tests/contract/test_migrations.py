"""The migrations build exactly the table that relay.schema defines, on every database, and
downgrade cleanly: the one schema definition and the shipped migrations cannot drift apart."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from devtools.outbox import fates, statuses
from devtools.servers import wait_until
from relay.cli import main
from relay.constants import PROTOCOL
from relay.db.claims import ClaimStore
from relay.db.clock import database_time, seconds_between
from relay.db.columns import sent_key
from relay.db.migrate import live_relays, migrate
from relay.db.outbox import OutboxAdmin, OutboxWriter
from relay.db.schema import built_on, metadata, outbox, outbox_buckets
from relay.errors import SchemaMissingError, StoreError
from relay.records import SENT, NewMessage, SettleBatch
from relay.upgrade import LiveRelay
from tests.support.privileges import definer_functions

# This release's newest revision, which an upgrade to "head" reaches.
HEAD = str(ScriptDirectory(str(resources.files("relay.db.migrations"))).get_current_head())


def differences(url: str) -> list[object]:
    """Alembic's comparison, plus the text collations it does not compare. An index the schema
    builds on other databases only (``ddl_if``: MySQL's stand in for partial ones) is left out
    of the comparison, as ``create_all`` leaves it out."""
    engine = sa.create_engine(url)

    def built_here(item: object, _name: object, _kind: str, reflected: bool, _: object) -> bool:
        if isinstance(item, sa.Table) and not reflected and not built_on(item, engine.dialect):
            return False
        condition = getattr(item, "_ddl_if", None)
        if reflected or condition is None:
            return True
        if condition.dialect is not None and condition.dialect != engine.dialect.name:
            return False
        call = condition.callable_
        return call is None or bool(call(None, item, None, dialect=engine.dialect))

    try:
        with engine.connect() as conn:
            opts = {"compare_type": True, "include_object": built_here}
            context = MigrationContext.configure(conn, opts=opts)
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


@contextmanager
def upgraded(database_url: str) -> Iterator[ClaimStore]:
    """Upgrade to the head, which must build the table the schema defines, and open a relay
    of the new version, its first turn taken."""
    migrate(database_url)
    assert differences(database_url) == []
    store = ClaimStore(database_url, "new-relay", 60.0)
    try:
        store.turn()
        yield store
    finally:
        store.close()


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


def test_upgrade_to_the_sent_log_keeps_every_pending_and_in_flight_row(database_url: str) -> None:
    """0003 -> 0004 on a live outbox, its relays stopped: a pending row is due, a row an old
    relay holds (its lease in ``next_attempt_at``) waits out that lease, a sent row stays sent
    and its id stays taken; the first new ack goes to the sent log, and its id written again
    is claimed as sent before."""
    migrate(database_url, "base", downgrade=True)
    migrate(database_url, "0003")
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        rows = [("due", "pending", None), ("held", "pending", "old-relay"), ("sent", "sent", None)]
        for message_id, status, owner in rows:
            conn.execute(
                sa.text(
                    "INSERT INTO outbox (message_id, payload, status, lease_owner) "
                    "VALUES (:m, :p, :s, :o)"
                ),
                {"m": message_id, "p": b"x", "s": status, "o": owner},
            )
        old_lease = sa.update(
            sa.table("outbox", sa.column("message_id"), sa.column("next_attempt_at"))
        )
        conn.execute(
            old_lease.where(sa.column("message_id") == "held").values(
                next_attempt_at=database_time(3600)
            )
        )
    engine.dispose()
    with upgraded(database_url) as store:
        writer = OutboxWriter(database_url)
        try:
            (due,) = store.claim(10, 2**62)
            assert due.message_id == "due", "only the due row: the old lease still holds"
            store.settle(SettleBatch(sent=(due.id,)))
            writer.enqueue([NewMessage(b"x", message_id="due")])
            with pytest.raises(StoreError):
                writer.enqueue([NewMessage(b"x", message_id="sent")])
            (again,) = store.claim(10, 2**62)
            assert (again.message_id, again.sent_before) == ("due", True)
            store.settle(SettleBatch(duplicates=(again.id,)))
            assert statuses(database_url) == {"pending": 1, "sent": 2}
        finally:
            writer.close()


def test_upgrade_to_owned_buckets_keeps_every_pending_and_in_flight_row(database_url: str) -> None:
    """0004 -> 0005 on a live outbox, its relays stopped: a row an old relay still holds under
    its row lease is due when that lease ends (not before: it may be in flight), a row whose
    lease ran out and a row never claimed are due now, and a relay of the new version owns
    every bucket and claims them."""
    migrate(database_url, "base", downgrade=True)
    migrate(database_url, "0004")
    engine = sa.create_engine(database_url)
    leases = {"never claimed": None, "lease ran out": -60.0, "in flight": 3600.0}
    table = sa.table(
        "outbox",
        sa.column("message_id"),
        sa.column("payload"),
        sa.column("lease_owner"),
        sa.column("lease_until"),
    )
    with engine.begin() as conn:
        for message_id, lease in leases.items():
            conn.execute(
                sa.insert(table).values(
                    message_id=message_id,
                    payload=b"x",
                    lease_owner=None if lease is None else "old-relay",
                    lease_until=None if lease is None else database_time(lease),
                )
            )
    engine.dispose()
    with upgraded(database_url) as store:
        claimed = {r.message_id for r in store.claim(10, 2**62)}
        assert claimed == {"never claimed", "lease ran out"}
        with store.engine.connect() as conn:
            wait = sa.select(seconds_between(database_time(), outbox.c.next_attempt_at)).where(
                outbox.c.message_id == "in flight"
            )
            assert 3500 < conn.execute(wait).scalar_one() <= 3600


def test_upgrade_to_the_suspect_column_keeps_the_suspects_marked_in_last_error(
    database_url: str,
) -> None:
    """0005 -> 0006: a pending row the old relays marked a suspect (a phrase in last_error) is
    a suspect when claimed; a row with another error, a parked suspect and a clean row are
    not."""
    migrate(database_url, "base", downgrade=True)
    migrate(database_url, "0005")
    engine = sa.create_engine(database_url)
    marked = "lost: channel closed by the broker: 406 PRECONDITION_FAILED - unknown rule"
    rows = {
        "suspect": ("pending", marked),
        "innocent": ("pending", "lost: lost with a channel the broker closed for another row"),
        "clean": ("pending", None),
        "parked suspect": ("parked", marked),
    }
    table = sa.table(
        "outbox",
        sa.column("message_id"),
        sa.column("payload"),
        sa.column("status"),
        sa.column("last_error"),
    )
    with engine.begin() as conn:
        for message_id, (status, error) in rows.items():
            conn.execute(
                sa.insert(table).values(
                    message_id=message_id, payload=b"x", status=status, last_error=error
                )
            )
    engine.dispose()
    with upgraded(database_url) as store:
        claimed = {r.message_id: r.suspect for r in store.claim(10, 2**62)}
        assert claimed == {"suspect": True, "innocent": False, "clean": False}
        with store.engine.connect() as conn:
            parked = sa.select(outbox.c.suspect).where(outbox.c.message_id == "parked suspect")
            assert conn.execute(parked).scalar_one() is False


def ack_all_as_before(url: str) -> list[int]:
    """What a relay of a release before 0015 made of an ack of every row: the rows deleted,
    their keys logged in its log. Their ids, in order."""
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            acked = list(conn.scalars(sa.select(outbox.c.id).order_by(outbox.c.id)))
            entries = sa.select(
                sent_key(outbox.c.message_id), outbox.c.id, outbox.c.created_at, database_time()
            )
            columns = ["key", "id", "created_at", "sent_at"]
            log = sa.table("outbox_sent", *(sa.column(c) for c in columns))
            conn.execute(sa.insert(log).from_select(columns, entries))
            conn.execute(sa.delete(outbox))
        return acked
    finally:
        engine.dispose()


def _highest_acked_then_one_more(store: ClaimStore, writer: OutboxWriter) -> tuple[int, int]:
    """Ack (and so delete) the highest row, then write one more: (the acked id, the new id)."""
    highest = max(store.claim(10, 2**62), key=lambda r: r.id)
    store.settle(SettleBatch(sent=(highest.id,)))
    writer.enqueue([NewMessage(b"x", message_id="next")])
    (new,) = (r for r in store.claim(10, 2**62) if r.message_id == "next")
    return highest.id, new.id


def test_relays_before_0015_run_beside_it_and_their_acks_are_seen_after_it(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """0015 expands beside the relays of the release before: `relay migrate` goes through
    while one holds buckets (it refused, and every relay had to stop), and what such a
    relay acks into its own log after the migration (cut off past its lease while a relay
    of this release took over, say) is seen by this release's claims: the id, written
    again, is dropped; a new one is claimed."""
    environ = {"RELAY_DATABASE_URL": database_url}
    migrate(database_url, "0014", downgrade=True)
    writer = OutboxWriter(database_url)
    engine = sa.create_engine(database_url)
    try:
        writer.enqueue([NewMessage(b"x", message_id="m-1")])
        with engine.begin() as conn:  # a relay of the release before, holding buckets
            conn.execute(
                sa.update(outbox_buckets)
                .where(outbox_buckets.c.bucket < 5)
                .values(owner="old", lease_until=database_time(60))
            )
        assert main(["migrate"], environ) == 0, capsys.readouterr().err
        assert "live relay old: protocol 1, 5 buckets" in capsys.readouterr().out
        assert ack_all_as_before(database_url) == [1]
        with engine.begin() as conn:  # it stopped
            conn.execute(sa.update(outbox_buckets).values(owner=None, lease_until=None))
        writer.enqueue([NewMessage(b"x", message_id="m-1"), NewMessage(b"x", message_id="m-2")])
        store = ClaimStore(database_url, "relay", 60.0)
        try:
            store.turn()
            claimed = {r.message_id: r.sent_before for r in store.claim(10, 2**62)}
            assert claimed == {"m-1": True, "m-2": False}
        finally:
            store.close()
    finally:
        engine.dispose()
        writer.close()
    assert differences(database_url) == []


def test_the_purge_empties_the_log_of_the_releases_before_over_the_horizon(
    database_url: str,
) -> None:
    """What relays before 0015 logged stays in their log, which this release counts as sent
    (`relay status`) and purges at the horizon as its own; a later release drops it once
    it is empty."""
    migrate(database_url, "0014", downgrade=True)
    writer = OutboxWriter(database_url)
    try:
        writer.enqueue([NewMessage(b"x", message_id=m) for m in ("old", "new")])
    finally:
        writer.close()
    acked = ack_all_as_before(database_url)
    migrate(database_url)
    engine = sa.create_engine(database_url)
    legacy = sa.table("outbox_sent", sa.column("id"), sa.column("sent_at"))
    with engine.begin() as conn:
        conn.execute(
            sa.update(legacy)
            .where(legacy.c.id == acked[0])
            .values(sent_at=database_time(-8 * 86400))
        )
    engine.dispose()
    admin = OutboxAdmin(database_url)
    try:
        assert admin.status().counts[SENT] == 2
        assert admin.purge(7 * 86400) == 1
        assert admin.status().counts[SENT] == 1
    finally:
        admin.close()
    assert fates(database_url, ["old", "new"]) == {"new": SENT}


def test_the_upgrade_to_0015_leaves_a_publication_of_the_old_log_as_it_is(
    postgresql_url: str,
) -> None:
    """A change-data-capture feed that publishes the old log: 0015 makes its new log beside
    it (it rewrote the old one unlogged, which PostgreSQL refuses for a published table),
    so the upgrade goes through and the publication stays as it was."""
    migrate(postgresql_url, "0014", downgrade=True)
    engine = sa.create_engine(postgresql_url)
    published = sa.text("SELECT tablename FROM pg_publication_tables WHERE pubname = 'cdc'")
    try:
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE PUBLICATION cdc FOR TABLE outbox, outbox_sent"))
        migrate(postgresql_url)
        with engine.begin() as conn:
            assert sorted(conn.execute(published).scalars()) == ["outbox", "outbox_sent"]
            conn.execute(sa.text("DROP PUBLICATION cdc"))
    finally:
        engine.dispose()
    assert differences(postgresql_url) == []


def test_a_deleted_highest_id_is_never_handed_out_again(database_url: str) -> None:
    """An ack deletes its row: were its id given to the next row, a stale ack (or a settle
    retried after a commit the relay did not see) would delete that row unpublished."""
    store = ClaimStore(database_url, "relay", 60.0)
    writer = OutboxWriter(database_url)
    try:
        store.turn()
        writer.enqueue([NewMessage(b"x") for _ in range(3)])
        acked, new = _highest_acked_then_one_more(store, writer)
        assert new > acked
    finally:
        store.close()
        writer.close()


def test_upgrade_to_ids_never_reused_starts_above_every_id_seen(database_url: str) -> None:
    """0007 -> 0008 (SQLite's outbox copied into an AUTOINCREMENT table): the next id is above
    the outbox's and the sent log's, though the highest row was already deleted."""
    migrate(database_url, "base", downgrade=True)
    migrate(database_url, "0007")
    writer = OutboxWriter(database_url)
    writer.enqueue([NewMessage(b"x") for _ in range(3)])
    acked = ack_all_as_before(database_url)
    try:
        with upgraded(database_url) as upgraded_store:
            writer.enqueue([NewMessage(b"x", message_id="after")])
            (after,) = upgraded_store.claim(10, 2**62)
            assert after.id > max(acked)
    finally:
        writer.close()


def test_upgrade_to_no_pad_keys_tells_ids_differing_by_trailing_spaces_apart(
    database_url: str,
) -> None:
    """0009 -> 0010 on a live outbox (MySQL and MariaDB's keys were PAD SPACE, where ``'k-1'``
    and ``'k-1 '`` are one value): the pending row and the sent log's entry stay, and an id
    that differs from either by a trailing space is a message of its own, as is an inbox key.
    The earlier migrations build with today's column types: the downgrade from 0010 is what
    puts back the collation that 0009 left."""
    migrate(database_url, "0009", downgrade=True)
    writer = OutboxWriter(database_url)
    writer.enqueue([NewMessage(b"x", message_id="sent-1")])
    ack_all_as_before(database_url)
    writer.enqueue([NewMessage(b"x", message_id="k-1")])
    if database_url.startswith("mysql"):
        with pytest.raises(StoreError):  # PAD SPACE: one value to the unique index
            writer.enqueue([NewMessage(b"y", message_id="k-1 ")])
    try:
        with upgraded(database_url) as new_store:
            writer.enqueue(
                [NewMessage(b"y", message_id="k-1 "), NewMessage(b"y", message_id="sent-1 ")]
            )
            claimed = {(r.message_id, r.sent_before) for r in new_store.claim(10, 2**62)}
            assert claimed == {("k-1", False), ("k-1 ", False), ("sent-1 ", False)}
            engine = sa.create_engine(database_url)
            with engine.begin() as conn:
                for key in ("m", "m "):
                    conn.execute(
                        sa.text(
                            "INSERT INTO inbox_received (consumer, message_id) VALUES ('c', :m)"
                        ),
                        {"m": key},
                    )
                found = conn.execute(
                    sa.text("SELECT message_id FROM inbox_received WHERE message_id = 'm '")
                ).scalars()
                assert list(found) == ["m "]
            engine.dispose()
    finally:
        writer.close()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_no_revision_up_or_down_leaves_code_that_runs_with_its_owners_rights(
    database_url: str,
) -> None:
    """Down from the head one revision at a time by ``relay migrate --revision R --downgrade``,
    then up again one at a time: no step leaves a ``SECURITY DEFINER`` function (0004's
    dedupe function was one, and a downgrade below 0007 made it again)."""
    shipped = resources.files("relay.db.migrations") / "versions"
    revisions = sorted(f.name[:4] for f in shipped.iterdir() if f.name[:4].isdigit())
    assert len(revisions) >= 11 and revisions[0] == "0001"
    environ = {"RELAY_DATABASE_URL": database_url}

    def definers() -> int:
        engine = sa.create_engine(database_url)
        with engine.connect() as conn:
            found = definer_functions(conn)
        engine.dispose()
        return found

    walked = []
    for revision in [*reversed(revisions[:-1]), "base"]:
        assert main(["migrate", "--revision", revision, "--downgrade"], environ) == 0
        walked.append((revision, definers()))
    for revision in revisions:
        migrate(database_url, revision)
        walked.append((revision, definers()))
    assert walked == [(revision, 0) for revision, _ in walked]
    assert differences(database_url) == []


def revision_of(url: str) -> str | None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def test_every_revision_says_which_relays_may_run_beside_it() -> None:
    """``relay migrate`` reads each revision's ``least_protocol``: a new migration's author
    must say it (None, or the protocol older relays cannot run beside)."""
    versions = resources.files("relay.db.migrations") / "versions"
    for path in versions.iterdir():
        if path.name.endswith(".py") and path.name[:4].isdigit():
            assert "\nleast_protocol = " in path.read_text(), path.name


def test_migrate_refuses_a_downgrade_while_relays_hold_buckets(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A relay of this release holds buckets: a downgrade is refused, naming it, and nothing
    moves; --force moves; once the relay has stopped, no force is needed."""
    environ = {"RELAY_DATABASE_URL": database_url}
    store = ClaimStore(database_url, "relay-a", 60.0)
    try:
        store.turn()
        assert main(["migrate", "--revision", "0012", "--downgrade"], environ) == 1
        err = capsys.readouterr().err
        assert f"a downgrade while relays hold buckets: relay-a (protocol {PROTOCOL}, 64" in err
        assert "or pass --force" in err
        assert revision_of(database_url) == HEAD
        store.close()
        assert main(["migrate", "--revision", "0012", "--downgrade"], environ) == 0
        assert revision_of(database_url) == "0012"
        assert main(["migrate"], environ) == 0
        store = ClaimStore(database_url, "relay-a", 60.0)
        store.turn()
        forced = ["migrate", "--revision", "0012", "--downgrade", "--force"]
        assert main(forced, environ) == 0
        assert f"live relay relay-a: protocol {PROTOCOL}, 64 buckets" in capsys.readouterr().out
        assert revision_of(database_url) == "0012"
    finally:
        store.close()


def test_migrate_refuses_a_migration_older_relays_cannot_run_beside(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """At 0006, a relay of that release holds buckets (its presence says no protocol): the
    upgrade through 0007 (relays before it would publish re-written ids again) is refused
    while its leases live, naming it; a relay present but holding none is no obstacle."""
    environ = {"RELAY_DATABASE_URL": database_url}
    migrate(database_url, "0006", downgrade=True)
    relays = sa.table("outbox_relays", sa.column("owner"), sa.column("alive_until"))
    buckets = sa.table(
        "outbox_buckets", sa.column("bucket"), sa.column("owner"), sa.column("lease_until")
    )
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.insert(relays).values(owner="old", alive_until=database_time(60)))
        conn.execute(sa.insert(relays).values(owner="idle", alive_until=database_time(60)))
        held = sa.column("bucket") < 5
        conn.execute(
            sa.update(buckets).where(held).values(owner="old", lease_until=database_time(60))
        )
    assert main(["migrate"], environ) == 1
    err = capsys.readouterr().err
    assert "needs relays of protocol 2 or later" in err  # 0007's
    assert "old (protocol 1, 5 buckets)" in err and "idle" not in err
    assert revision_of(database_url) == "0006"
    with engine.begin() as conn:  # the old relay stopped: its buckets given up
        conn.execute(sa.update(buckets).values(owner=None, lease_until=None))
    engine.dispose()
    assert main(["migrate"], environ) == 0
    assert "live relay idle: protocol 1, 0 buckets" in capsys.readouterr().out
    assert differences(database_url) == []


def test_migrate_and_the_fence_see_the_same_bucket_holders(database_url: str) -> None:
    """A relay that holds buckets is live to ``relay migrate``, whether present or not: one
    of this release that cannot publish says its protocol while it holds any; one that says
    none, or has left the relays (a release before protocols, when its broker went away),
    is of protocol 1."""
    store = ClaimStore(database_url, "relay-a", 60.0)
    writer = OutboxWriter(database_url)
    engine = sa.create_engine(database_url)
    try:
        store.turn()
        writer.enqueue([NewMessage(b"x", "ex", "k")])
        assert len(store.claim(10, 2**62)) == 1
        store.turn(active=False)  # it keeps the bucket of the row it holds
        with engine.begin() as conn:  # another bucket leased to relay-old, not present
            conn.execute(
                sa.update(outbox_buckets)
                .where(outbox_buckets.c.owner.is_(None), outbox_buckets.c.bucket == 63)
                .values(owner="relay-old", lease_until=database_time(60))
            )
        with engine.connect() as conn:
            live = live_relays(conn)
        assert live == [LiveRelay("relay-a", PROTOCOL, 1), LiveRelay("relay-old", 1, 1)]
    finally:
        engine.dispose()
        writer.close()
        store.close()


# A `relay migrate` in a process of its own (Alembic's context is one per process), which
# says it is ready and waits for a line before it migrates.
MIGRATE_ON_CUE = (
    "import sys; from relay.db.migrate import migrate; "
    "print('ready', flush=True); sys.stdin.readline(); migrate(sys.argv[1])"
)


def test_migrations_run_side_by_side_one_after_the_other(database_url: str) -> None:
    """Every new pod of a Deployment migrates before it starts (its init container): two
    `relay migrate` at once, on an empty database, both succeed, the second finding the
    schema current (it failed on the tables the first was creating)."""
    migrate(database_url, "base", downgrade=True)
    both = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATE_ON_CUE, database_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for process in both:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
    for process in both:  # cued together
        assert process.stdin is not None
        process.stdin.write("\n")
        process.stdin.flush()
    ended = [process.communicate(timeout=120) for process in both]
    assert [process.returncode for process in both] == [0, 0], ended
    assert revision_of(database_url) == HEAD
    assert differences(database_url) == []


def test_migrate_leaves_a_schema_newer_than_its_release_as_it_is(
    database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rollback's pods run the older release's `relay migrate` first (its init container):
    on a schema a later release migrated it changes nothing and succeeds, so that they
    start (the schema's least protocol says whether they may claim); a revision asked for
    by name is still refused."""
    environ = {"RELAY_DATABASE_URL": database_url}
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE alembic_version SET version_num = '9999'"))
    assert main(["migrate"], environ) == 0
    assert f"outbox schema is at revision 9999, newer than this release's ({HEAD})" in (
        capsys.readouterr().out
    )
    assert main(["migrate", "--revision", HEAD], environ) == 2
    with engine.connect() as conn:
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() == "9999"
        conn.execute(sa.text("UPDATE alembic_version SET version_num = :head"), {"head": HEAD})
        conn.commit()
    engine.dispose()


def test_a_relay_on_a_schema_it_needs_migrated_names_the_missing_table(database_url: str) -> None:
    """The docs' order is migrate first: a relay of this release on 0012 claims nothing: its
    turn and its claim fail naming a table to migrate for, not the outbox."""
    migrate(database_url, "0012", downgrade=True)
    store = ClaimStore(database_url, "relay-a", 60.0)
    try:
        with pytest.raises(SchemaMissingError) as raised:
            store.turn()
        assert str(raised.value).startswith("the outbox_protocol table does not exist in ")
        assert str(raised.value).endswith(": run `relay migrate`")
        # Either table 0015 made (a database names the first its plan meets).
        with pytest.raises(SchemaMissingError, match=r"the outbox_sent_(state|log) table"):
            store.claim(10, 2**62)
    finally:
        store.close()


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
def test_a_migration_waiting_behind_a_long_transaction_lets_the_writers_through(
    database_url: str,
) -> None:
    """An application's transaction left open on the outbox: the migration's DDL, which
    waits for its lock, must not hold up every writer's INSERT behind it for as long as the
    transaction stays open (a stop of delivery as long as the longest transaction)."""
    migrate(database_url, "0015", downgrade=True)  # 0016 indexes the outbox
    engine = sa.create_engine(database_url)
    holder = engine.connect()
    holder.begin()
    holder.execute(sa.insert(outbox).values(exchange="", routing_key="", payload=b"open"))
    migrating = threading.Thread(target=migrate, args=(database_url,))
    written = threading.Event()

    def write() -> None:
        with engine.begin() as conn:
            conn.execute(sa.insert(outbox).values(exchange="", routing_key="", payload=b"w"))
        written.set()

    try:
        migrating.start()
        wait_until(lambda: _waiting_for_a_lock(engine), 60, "the migration waiting for its lock")
        writer = threading.Thread(target=write)
        writer.start()
        # Without the bound, the writer waits behind the migration until the holder ends.
        got_through = written.wait(60)
    finally:
        holder.rollback()
        holder.close()
    migrating.join(120)
    writer.join(60)
    engine.dispose()
    assert got_through
    assert revision_of(database_url) == HEAD


def _waiting_for_a_lock(engine: sa.Engine) -> bool:
    waiting = sa.text(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND query LIKE 'CREATE INDEX%'"
    )
    with engine.connect() as conn:
        return bool(conn.execute(waiting).scalar())
