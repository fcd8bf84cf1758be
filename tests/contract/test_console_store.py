"""The console's database code (``relay.db.console``, ``console_rows``, ``console_actions``)
on every database: causes, pages, counts, and changes pinned to what the operator saw, each
with its audit entry."""

from __future__ import annotations

import json
import threading
import uuid
from datetime import timedelta

import pytest
import sqlalchemy as sa

from devtools.servers import PostgresServer, wait_until
from relay.admin_records import Selection
from relay.causes import UNSORTED
from relay.console_constants import CONSOLE_CHUNK_ROWS, CONSOLE_LISTED_CHARS, CONSOLE_NAMED_IDS
from relay.console_records import (
    Actor,
    ArchiveFilter,
    AuditFilter,
    Counted,
    LeftAfter,
    ParkedFilter,
)
from relay.db.causes import CauseSorter
from relay.db.clock import database_time
from relay.db.console import ConsoleReads
from relay.db.console_actions import ConsoleActions
from relay.db.console_counts import Budget
from relay.db.dialects import for_url
from relay.db.outbox import OutboxAdmin
from relay.db.roles import CONSOLE, grants
from relay.db.schema import console_audit, outbox
from relay.errors import InputError, StoreError
from relay.records import PARKED
from tests.support.console import SETTLED, park, statuses_of

OTTO = Actor("otto", "operator")
ADA = Actor("ada", "admin")
NO_ROUTE = "returned: 312 NO_ROUTE"


def audit(url: str) -> list[sa.Row[tuple[object, ...]]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(sa.select(console_audit).order_by(console_audit.c.id)))
    finally:
        engine.dispose()


def test_parked_rows_group_by_cause_whatever_their_messages_name(database_url: str) -> None:
    park(database_url, [{"message_id": f"a{i}"} for i in range(3)], NO_ROUTE)
    for name in ("orders-1", "orders-2"):
        park(
            database_url,
            [{"message_id": f"{name}-{i}"} for i in range(2)],
            f"failed: 404 NOT_FOUND - no exchange '{name}' in vhost '/'",
        )
    reads = ConsoleReads(database_url)
    try:
        causes = {c.cause: c for c in reads.overview().causes.listed}
        overview = reads.overview()
    finally:
        reads.close()
    missing = "failed: 404 NOT_FOUND - no exchange '…' in vhost '…'"
    assert {name: c.rows for name, c in causes.items()} == {
        NO_ROUTE: Counted(3),
        missing: Counted(4),
    }
    first, last = causes[missing].first_parked, causes[missing].last_parked
    assert first is not None and last is not None and first <= last
    assert overview.causes.parked == Counted(7) and overview.pending == Counted(0)


def test_rows_parked_without_a_cause_are_listed_apart_until_a_relay_sorts_them(
    database_url: str,
) -> None:
    """Rows a relay of the release before parked have no cause (migration 0018): a line of
    their own, whose rows a page finds; a relay's sorter gives each its cause, a chunk at a
    time, and they join it."""
    park(database_url, [{"message_id": f"a{i}"} for i in range(3)], NO_ROUTE)
    old = park(
        database_url,
        [{"message_id": f"o{i}"} for i in range(5)],
        "failed: 404 NOT_FOUND - no exchange 'x' in vhost '/'",
    )
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:  # as a relay of the release before parked them
        conn.execute(sa.update(outbox).where(outbox.c.id.in_(old)).values(cause=None))
    engine.dispose()
    reads, sorter = ConsoleReads(database_url), CauseSorter(database_url)
    try:
        before = {c.cause: c.rows for c in reads.overview().causes.listed}
        unsorted, _ = reads.page(ParkedFilter(cause=UNSORTED), None, 10)
        sorted_rows = [sorter.sort(2) for _ in range(4)]
        after = {c.cause: c.rows for c in reads.overview().causes.listed}
    finally:
        reads.close()
        sorter.close()
    assert before == {NO_ROUTE: Counted(3), UNSORTED: Counted(5)}
    assert sorted(r.id for r in unsorted) == old
    assert sorted_rows == [2, 2, 1, 0]
    missing = "failed: 404 NOT_FOUND - no exchange '…' in vhost '…'"
    assert after == {NO_ROUTE: Counted(3), missing: Counted(5)}


def test_the_unsorted_rows_keep_their_line_past_the_walks_budget(database_url: str) -> None:
    """Rows parked by a relay of the release before are the oldest, the walk's last: when
    it stopped short of them their line went (an outside review)."""
    park(database_url, [{"message_id": f"a{i}"} for i in range(6)], NO_ROUTE)
    old = park(database_url, [{"message_id": f"o{i}"} for i in range(4)], "nacked", ago=60)
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.update(outbox).where(outbox.c.id.in_(old)).values(cause=None))
    engine.dispose()
    hurried = ConsoleReads(database_url, Budget(seconds=0, chunk=5))
    try:
        listed = {c.cause: str(c.rows) for c in hurried.overview().causes.listed}
    finally:
        hurried.close()
    expected = {NO_ROUTE: "at least 5"}
    # MySQL and MariaDB have no index of causes: theirs are the walk's alone.
    if for_url(sa.make_url(database_url)).partial_indexes:
        expected[UNSORTED] = "more than 0"
    assert listed == expected


@pytest.mark.parametrize("by", ["the console", "relay replay"])
def test_a_replayed_row_parked_again_by_an_older_relay_is_sorted_afresh(
    database_url: str, by: str
) -> None:
    """A replay, the console's or ``relay replay``'s, takes a row's cause off: a relay of
    the release before, parking it again with another error (and no cause), left it under
    the first one's (an outside review)."""
    (row,) = park(database_url, [{"message_id": "r"}], NO_ROUTE, ago=SETTLED)
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    sorter, engine = CauseSorter(database_url), sa.create_engine(database_url)
    admin = OutboxAdmin(database_url)
    try:
        if by == "the console":
            actions.replay(Actor("otto", "operator"), [row], None, reads.now())
        else:
            assert admin.replay(Selection(ids=(row,)), dry_run=False)[0] == 1
        with engine.begin() as conn:  # as a relay of the release before parks it
            conn.execute(
                sa.update(outbox)
                .where(outbox.c.id == row)
                .values(status=PARKED, last_error="rejected: headers are not a JSON object")
            )
        assert sorter.sort(10) == 1
        with engine.connect() as conn:
            cause = conn.execute(sa.select(outbox.c.cause).where(outbox.c.id == row)).scalar()
    finally:
        reads.close()
        actions.close()
        sorter.close()
        admin.close()
        engine.dispose()
    assert cause == "rejected: headers are not a JSON object"


def test_pages_walk_every_parked_row_once_most_recently_parked_first(database_url: str) -> None:
    ids = [
        park(database_url, [{"message_id": f"m{i}", "exchange": "x"}], NO_ROUTE)[0]
        for i in range(7)
    ]
    park(database_url, [{"message_id": "other", "exchange": "y"}], NO_ROUTE)
    reads = ConsoleReads(database_url)
    seen: list[int] = []
    try:
        page, after = reads.page(ParkedFilter(exchange="x"), None, 3)
        seen += [r.id for r in page]
        while after is not None:
            page, after = reads.page(ParkedFilter(exchange="x"), after, 3)
            seen += [r.id for r in page]
    finally:
        reads.close()
    assert seen == sorted(ids, reverse=True)


@pytest.mark.parametrize("value", ["' OR '1'='1", "%", "_", "\\", '"; DROP TABLE outbox; --'])
def test_filter_values_are_matched_as_text(database_url: str, value: str) -> None:
    (exact,) = park(database_url, [{"message_id": "exact", "exchange": value}], value)
    park(database_url, [{"message_id": "plain", "exchange": "plain"}], "nacked")
    reads = ConsoleReads(database_url)
    try:
        by_exchange, _ = reads.page(ParkedFilter(exchange=value), None, 10)
        by_reason, _ = reads.page(ParkedFilter(reason=value), None, 10)
    finally:
        reads.close()
    assert [r.id for r in by_exchange] == [exact] and [r.id for r in by_reason] == [exact]


def test_a_filtered_replay_changes_only_rows_parked_by_its_bound(database_url: str) -> None:
    seen = park(
        database_url,
        [{"message_id": f"s{i}", "exchange": "x"} for i in range(5)],
        NO_ROUTE,
        ago=SETTLED,
    )
    reads = ConsoleReads(database_url)
    actions = ConsoleActions(database_url)
    try:
        bound = reads.now()
        late = park(database_url, [{"message_id": "late", "exchange": "x"}], NO_ROUTE)
        assert reads.count(ParkedFilter(exchange="x"), bound) == Counted(5)
        assert actions.left_after(ParkedFilter(exchange="x"), bound) == LeftAfter(1, tuple(late))
        result = actions.replay(OTTO, None, ParkedFilter(exchange="x"), bound)
    finally:
        reads.close()
        actions.close()
    assert (result.changed, result.parked_since, result.since_ids) == (5, 1, (late[0],))
    assert statuses_of(database_url, seen + late) == {
        **dict.fromkeys(seen, "pending"),
        late[0]: "parked",
    }
    (entry,) = audit(database_url)
    assert (entry.actor, entry.action, entry.rows, entry.result) == (
        "otto",
        "replay",
        5,
        f"done; left 1 parked after the bound: ids {late[0]}",
    )
    assert json.loads(entry.target)["filter"] == {"exchange": "x"}


def test_a_row_parked_before_the_bound_but_committed_after_it_is_left(database_url: str) -> None:
    (seen,) = park(database_url, [{"message_id": "seen", "exchange": "x"}], NO_ROUTE, ago=SETTLED)
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        inserted = conn.execute(
            sa.insert(outbox).values(message_id="late", exchange="x", routing_key="", payload=b"x")
        )
        late = int(inserted.inserted_primary_key[0])  # type: ignore[index]
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    try:
        # A settle as the relay's: the row stamped parked at its statement's time, committed
        # only after the page was drawn (which could not see it).
        with engine.connect() as relay:
            relay.begin()
            relay.execute(
                sa.update(outbox)
                .where(outbox.c.id == late)
                .values(status=PARKED, last_error=NO_ROUTE, next_attempt_at=database_time())
            )
            page, _ = reads.page(ParkedFilter(exchange="x"), None, 10)
            bound = reads.now()
            relay.commit()
        assert [r.id for r in page] == [seen]
        assert reads.count(ParkedFilter(exchange="x"), bound) == Counted(1)
        assert actions.left_after(ParkedFilter(exchange="x"), bound) == LeftAfter(1, (late,))
        result = actions.replay(OTTO, None, ParkedFilter(exchange="x"), bound)
    finally:
        reads.close()
        actions.close()
        engine.dispose()
    assert (result.changed, result.parked_since) == (1, 1)
    assert statuses_of(database_url, [seen, late]) == {seen: "pending", late: "parked"}


def test_a_bulk_change_goes_in_chunks_and_its_entry_counts_them_all(database_url: str) -> None:
    rows = CONSOLE_CHUNK_ROWS + 5
    park(database_url, [{"message_id": f"c{i}"} for i in range(rows)], NO_ROUTE, ago=SETTLED)
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    try:
        result = actions.discard(OTTO, None, ParkedFilter(), reads.now())
        archived = reads.archived(ArchiveFilter(), None, rows + 1)
    finally:
        reads.close()
        actions.close()
    assert result.changed == rows and len(archived) == rows
    (entry,) = audit(database_url)
    assert (entry.action, entry.rows, entry.result) == ("discard", rows, "done")


def test_a_bulk_change_failing_midway_ends_its_entry_with_what_committed(
    postgresql_url: str,
) -> None:
    rows = CONSOLE_CHUNK_ROWS + 5
    ids = park(
        postgresql_url, [{"message_id": f"f{i}"} for i in range(rows)], NO_ROUTE, ago=SETTLED
    )
    engine = sa.create_engine(postgresql_url)
    reads, actions = ConsoleReads(postgresql_url), ConsoleActions(postgresql_url)
    raised: list[BaseException] = []

    def replay() -> None:
        try:
            actions.replay(OTTO, None, ParkedFilter(), reads.now())
        except StoreError as exc:
            raised.append(exc)

    waiting = sa.text(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND datname = current_database()"
    )
    try:
        with engine.connect() as other:
            other.begin()  # holds the second chunk's last row
            other.execute(sa.select(outbox.c.id).where(outbox.c.id == ids[-1]).with_for_update())
            worker = threading.Thread(target=replay)
            worker.start()
            # (Autocommit: a transaction would see one snapshot of pg_stat_activity.)
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as look:
                # The second chunk waits on that row: its connection is cut.
                wait_until(lambda: look.execute(waiting).first() is not None, 60, "a lock wait")
                (pid,) = look.execute(waiting).one()
                look.execute(sa.text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
            worker.join()
            other.rollback()
    finally:
        reads.close()
        actions.close()
        engine.dispose()
    assert len(raised) == 1
    (entry,) = audit(postgresql_url)
    assert (entry.action, entry.rows) == ("replay", CONSOLE_CHUNK_ROWS)
    assert entry.result == f"failed after {CONSOLE_CHUNK_ROWS} rows: StoreError"
    assert list(statuses_of(postgresql_url, ids).values()).count("pending") == CONSOLE_CHUNK_ROWS


def test_a_refused_edit_is_audited_as_failed(database_url: str) -> None:
    (row,) = park(database_url, [{"message_id": "r"}], NO_ROUTE)
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    try:
        actions.replay(OTTO, [row], None, reads.now())
        with pytest.raises(InputError):
            actions.edit(ADA, row, {"exchange": "x"})
    finally:
        reads.close()
        actions.close()
    entries = audit(database_url)
    assert [(e.action, e.rows, e.result) for e in entries] == [
        ("replay", 1, "done"),
        ("edit_and_replay", 0, "failed after 0 rows: InputError"),
    ]


def test_chosen_ids_that_changed_since_the_page_are_left_and_reported(database_url: str) -> None:
    ids = park(database_url, [{"message_id": f"i{i}"} for i in range(3)], NO_ROUTE)
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    try:
        bound = reads.now()
        actions.replay(OTTO, ids[:1], None, bound)  # someone else replayed it meanwhile
        result = actions.replay(OTTO, ids, None, bound)
    finally:
        reads.close()
        actions.close()
    assert (result.changed, result.left, result.left_ids) == (2, 1, (ids[0],))
    *_, entry = audit(database_url)
    assert entry.result == f"done; left 1 no longer as the page showed them: ids {ids[0]}"


def test_a_partial_change_names_the_first_rows_it_left_and_counts_the_rest(
    database_url: str,
) -> None:
    """A change of a cause by filter, rows of it parked after the bound: the entry names
    CONSOLE_NAMED_IDS of them, the lowest ids, and counts the rest."""
    park(database_url, [{"message_id": "old"}], NO_ROUTE, ago=SETTLED)
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    try:
        bound = reads.now()
        late = park(database_url, [{"message_id": f"n{i}"} for i in range(25)], NO_ROUTE)
        park(database_url, [{"message_id": "other"}], "nacked")  # another cause: not named
        result = actions.replay(OTTO, None, ParkedFilter(cause=NO_ROUTE), bound)
    finally:
        reads.close()
        actions.close()
    assert (result.changed, result.parked_since) == (1, 25)
    assert result.since_ids == tuple(late[:CONSOLE_NAMED_IDS])
    (entry,) = audit(database_url)
    shown = ", ".join(map(str, late[:CONSOLE_NAMED_IDS]))
    assert entry.result == f"done; left 25 parked after the bound: ids {shown} and 5 more"


def test_discarded_rows_are_restored_as_they_were(database_url: str) -> None:
    ids = park(
        database_url, [{"message_id": "d", "payload": b"\x00\xff", "headers": '{"a": 1}'}], NO_ROUTE
    )
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    try:
        actions.discard(OTTO, ids, None, reads.now())
        gone = statuses_of(database_url, ids)
        archived = reads.row(ids[0], 100)
        restored = actions.restore(OTTO, ids)
        back = reads.row(ids[0], 100)
    finally:
        reads.close()
        actions.close()
    assert gone == {} and archived is not None and archived.status == "discarded"
    assert restored.changed == 1 and back is not None
    assert (back.status, back.payload, back.headers, back.summary.last_error) == (
        "parked",
        b"\x00\xff",
        '{"a": 1}',
        NO_ROUTE,
    )
    assert [e.action for e in audit(database_url)] == ["discard", "restore"]


def test_a_list_shows_the_start_of_a_long_error_and_the_rows_page_all_of_it(
    database_url: str,
) -> None:
    error = "failed: " + "é" * (CONSOLE_LISTED_CHARS * 3)
    (row,) = park(database_url, [{"message_id": "long", "exchange": "x"}], error)
    reads = ConsoleReads(database_url)
    try:
        (listed,), _after = reads.page(ParkedFilter(exchange="x"), None, 10)
        whole = reads.row(row, 10)
    finally:
        reads.close()
    assert listed.last_error == error[:CONSOLE_LISTED_CHARS]
    assert whole is not None and whole.summary.last_error == error


def test_a_bulk_discard_is_undone_whole_by_a_restore_of_its_filter(database_url: str) -> None:
    many = CONSOLE_CHUNK_ROWS * 2 + 50  # more than one chunk of each change
    ids = park(
        database_url,
        [{"message_id": f"x{i}", "exchange": "x"} for i in range(many)],
        NO_ROUTE,
        ago=SETTLED,
    )
    (theirs,) = park(database_url, [{"message_id": "y", "exchange": "x"}], NO_ROUTE, ago=SETTLED)
    (later,) = park(database_url, [{"message_id": "z", "exchange": "x"}], NO_ROUTE)
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    mine = ArchiveFilter(discarded_by=OTTO.name, exchange="x")
    try:
        drawn = reads.now()
        discarded = actions.discard(OTTO, None, ParkedFilter(message_prefix="x"), drawn)
        actions.discard(ADA, [theirs], None, reads.now())
        # A row written again with a discarded row's message id: that one cannot come back.
        (again,) = park(database_url, [{"message_id": "x7", "exchange": "x"}], NO_ROUTE)
        bound = reads.now()
        wait_until(lambda: reads.now() > bound, 5, "the database's clock past the bound")
        actions.discard(OTTO, [later], None, reads.now())
        counted, left_after = reads.count_archived(mine, bound)
        restored = actions.restore(OTTO, None, mine, bound)
        listed = reads.archived(ArchiveFilter(), None, 10)
    finally:
        reads.close()
        actions.close()
    assert discarded.changed == many
    assert (counted, left_after.rows, left_after.ids) == (Counted(many), 1, (later,))
    assert (restored.changed, restored.left, restored.left_ids) == (many - 1, 1, (ids[7],))
    assert (restored.parked_since, restored.since_ids) == (1, (later,))
    back = statuses_of(database_url, [*ids, theirs, later, again])
    assert back == {**{i: PARKED for i in ids if i != ids[7]}, again: PARKED}
    assert sorted(r.id for r in listed) == sorted([ids[7], theirs, later])
    discard, *_, entry = audit(database_url)
    # The time the page was drawn, not the parking time the change reached back to.
    assert json.loads(discard.target)["bound"] == drawn.isoformat()
    assert json.loads(entry.target)["filter"] == {"discarded_by": "otto", "exchange": "x"}
    assert (
        entry.result
        == f"done; left 1 whose message id the outbox holds again, or restored meanwhile: "
        f"ids {ids[7]}; left 1 archived after the bound: ids {later}"
    )


def test_an_edited_copy_is_a_new_row_linked_to_its_kept_original(database_url: str) -> None:
    (original,) = park(database_url, [{"message_id": "o", "exchange": "old"}], NO_ROUTE)
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    try:
        result = actions.edit(ADA, original, {"exchange": "new", "payload": b"fixed"})
        (copy,) = result.new_ids
        with pytest.raises(InputError):
            actions.edit(ADA, copy, {"exchange": "again"})  # pending, not parked
        before, after = reads.row(original, 100), reads.row(copy, 100)
    finally:
        reads.close()
        actions.close()
    assert before is not None and after is not None
    assert (before.status, before.edited_into, before.summary.exchange) == ("parked", [copy], "old")
    assert (after.status, after.edited_from, after.payload) == ("pending", original, b"fixed")
    assert after.summary.message_id != "o"
    entry, refused = audit(database_url)
    assert "fixed" not in entry.target and json.loads(entry.target) == {
        "id": original,
        "changed": ["exchange", "payload"],
    }
    assert (refused.rows, refused.result) == (0, "failed after 0 rows: InputError")


def test_a_parked_rows_page_lists_its_keys_rows_held_behind_it(database_url: str) -> None:
    (head,) = park(database_url, [{"message_id": "h", "ordering_key": "k"}], NO_ROUTE)
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        for name in ("b1", "b2"):
            conn.execute(sa.insert(outbox).values(message_id=name, payload=b"x", ordering_key="k"))
    engine.dispose()
    reads = ConsoleReads(database_url)
    try:
        found = reads.row(head, 10)
    finally:
        reads.close()
    assert found is not None and [r.message_id for r in found.held] == ["b1", "b2"]


def test_an_ended_session_is_kept_until_its_lifetime_is_over(database_url: str) -> None:
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    try:
        now = reads.now()
        actions.end_session("over", now - timedelta(seconds=1))
        actions.end_session("live", now + timedelta(hours=1))
        actions.end_session("live", now + timedelta(hours=1))  # a second logout of it
        assert reads.session_ended("live")
        assert not reads.session_ended("over")  # past its lifetime: forgotten
    finally:
        reads.close()
        actions.close()


def test_the_console_role_has_what_the_console_does_and_no_more(
    postgres: PostgresServer, postgresql_url: str
) -> None:
    """A login with the console's grants (``relay.db.roles``) only: every read and change of
    the console works, and the sent log stays out of its reach."""
    name, password = f"c_{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    database = sa.make_url(postgresql_url).database or ""
    postgres.psql(f"CREATE ROLE {name} LOGIN PASSWORD '{password}'")
    postgres.psql("; ".join(grants("postgresql", CONSOLE, name)), database=database)
    url = sa.make_url(postgresql_url).set(username=name, password=password)
    console_url = url.render_as_string(hide_password=False)
    ids = park(
        postgresql_url, [{"message_id": f"g{i}", "ordering_key": "k"} for i in range(3)], NO_ROUTE
    )
    reads, actions = ConsoleReads(console_url), ConsoleActions(console_url)
    try:
        assert reads.overview().causes.parked == Counted(3)
        assert reads.row(ids[0], 10) is not None
        actions.replay(OTTO, ids[:1], None, reads.now())
        actions.discard(OTTO, None, ParkedFilter(), reads.now())
        actions.restore(OTTO, ids[1:2])
        actions.edit(ADA, ids[1], {"routing_key": "fixed"})
        actions.record(OTTO, "requeue_dead_letters", "{}", 0, "moved 0 of 0")
        assert len(reads.audit(AuditFilter(), None, 10)) == 5
        actions.end_session("a" * 64, reads.now() + timedelta(hours=1))
        assert reads.session_ended("a" * 64) and not reads.session_ended("b" * 64)
    finally:
        reads.close()
        actions.close()
    engine = sa.create_engine(console_url)
    try:
        with pytest.raises(sa.exc.ProgrammingError), engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM outbox_sent_log"))
    finally:
        engine.dispose()
