"""The console's counts and causes (``relay.db.console_counts``, ``relay.causes``):
exact, or a lower bound that was counted, never an estimate; every parked row's cause on the
overview or counted on its "other causes" line, however many distinct errors there are; and
the overview, the rows page's list and the confirm page's count agreeing."""

from __future__ import annotations

from collections import Counter

import sqlalchemy as sa

from relay.causes import CAUSES_LISTED, cause_of, stored_cause
from relay.console.forms import parked_filter
from relay.console_constants import CONSOLE_CAUSES_FOUND
from relay.console_records import Actor, Causes, Counted, LeftAfter, ParkedFilter
from relay.db.console import ConsoleReads
from relay.db.console_actions import ConsoleActions
from relay.db.console_counts import Budget
from relay.db.schema import console_audit, outbox
from relay.records import PARKED
from tests.support.console import SETTLED, park, statuses_of

NO_ROUTE = "returned: 312 NO_ROUTE"
MISSING = "failed: 404 NOT_FOUND - no exchange '…' in vhost '…'"
# A walk with all the time it needs: every count exact, whatever the machine's load.
UNHURRIED = Budget(seconds=3600)
# A walk that stops after its first chunk of this many rows.
HURRIED = Budget(seconds=0, chunk=1000)
# The PostgreSQL outbox at scale: 600 tenants' exchanges missing (600 texts, one cause),
# 1,000 errors of classes of their own (1,000 causes) and 1,000 timeouts naming their node
# (1,000 texts, one cause): 2,600 distinct texts. Each row's cause as the relay writes it
# (``truth`` checks them against ``relay.causes``).
FILL = """
INSERT INTO outbox (message_id, exchange, routing_key, payload, status, attempts, last_error,
                    cause, next_attempt_at)
SELECT 'p-' || g, 'tenant-' || (g % 600), '', '\\x78', 'parked', 10, error, cause,
       now() - interval '1 hour' + g * interval '1 millisecond'
FROM generate_series(1, 118009) g, LATERAL (SELECT
       CASE WHEN g <= 70008
              THEN 'failed: 404 NOT_FOUND - no exchange ''tenant-' || (g % 600)
                   || '.orders'' in vhost ''/'''
            WHEN g <= 110009 THEN 'returned: 312 NO_ROUTE'
            WHEN g <= 113009 THEN 'Refused' || (g % 1000) || 'Error: no'
            ELSE 'timeout: no confirm in 5000 ms from node ''rabbit-' || (g % 1000) || ''''
       END AS error,
       CASE WHEN g <= 70008 THEN 'failed: 404 NOT_FOUND - no exchange ''…'' in vhost ''…'''
            WHEN g <= 110009 THEN 'returned: 312 NO_ROUTE'
            WHEN g <= 113009 THEN 'Refused' || (g % 1000) || 'Error: no'
            ELSE 'timeout: no confirm in # ms from node ''…'''
       END AS cause) AS written
"""


def truth(url: str) -> Counter[str]:
    """Every parked row's cause, counted by reading them all; each row's stored cause is its
    error's (``relay.causes.stored_cause``)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            errors = conn.execute(
                sa.select(outbox.c.last_error, outbox.c.cause, sa.func.count())
                .where(outbox.c.status == PARKED)
                .group_by(outbox.c.last_error, outbox.c.cause)
            ).all()
    finally:
        engine.dispose()
    found: Counter[str] = Counter()
    for error, cause, rows in errors:
        assert cause == stored_cause(error), (error, cause)
        found[cause] += rows
    return found


def accounted(causes: Causes, true: Counter[str]) -> None:
    """Every cause of ``true`` listed or on the other line, each count exact or at most the
    true one, and the total what the causes add up to."""
    listed = {g.cause: g.rows for g in causes.listed}
    assert set(listed) <= set(true)
    for cause, rows in listed.items():
        assert rows.rows == true[cause] if rows.exact else rows.rows <= true[cause]
    total = sum(listed.values(), Counted(0)) + causes.other_rows
    assert total.rows == causes.parked.rows
    assert total.rows == true.total() if causes.parked.exact else total.rows < true.total()
    if causes.other_causes.exact:  # no cause dropped, however many the walk did not reach
        assert len(listed) + causes.other_causes.rows == len(true)


def test_more_than_500_distinct_errors_lose_no_cause(database_url: str) -> None:
    """600 tenants' exchanges come first in the reasons' order; the causes after them were
    dropped when 500 distinct reasons had been read."""
    park(
        database_url,
        [{"message_id": f"t{i}"} for i in range(600)],
        "failed: 404 NOT_FOUND - no exchange 'tenant-{}' in vhost '/'",
    )
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:  # a text of its own per tenant
        conn.execute(
            sa.update(outbox).values(
                last_error=sa.func.replace(outbox.c.last_error, "{}", outbox.c.message_id)
            )
        )
    engine.dispose()
    park(database_url, [{"message_id": f"z{i}"} for i in range(3)], "zz: last in order")
    reads = ConsoleReads(database_url, UNHURRIED)
    try:
        causes = reads.overview().causes
        page, _ = reads.page(parked_filter({"cause": "zz: last in order"}, reads.now()), None, 10)
    finally:
        reads.close()
    assert [(g.cause, g.rows) for g in causes.listed] == [
        (MISSING, Counted(600)),
        ("zz: last in order", Counted(3)),
    ]
    assert len(page) == 3


def test_a_count_out_of_time_says_at_least_what_it_counted(database_url: str) -> None:
    ids = park(database_url, [{"message_id": f"n{i}"} for i in range(8)], NO_ROUTE, ago=SETTLED)
    ids += park(database_url, [{"message_id": f"m{i}"} for i in range(4)], "nacked", ago=SETTLED)
    hurried = ConsoleReads(database_url, Budget(seconds=0, chunk=5))
    try:
        causes = hurried.overview().causes
        within = hurried.count(ParkedFilter(), hurried.now())
    finally:
        hurried.close()
    # The most recently parked first: the walk read the 4 nacked rows and one other.
    assert str(causes.parked) == "more than 5" and causes.unread_before is not None
    assert {g.cause: str(g.rows) for g in causes.listed} == {
        "nacked": "at least 4",
        NO_ROUTE: "at least 1",
    }
    assert str(within) == "at least 5"
    accounted(causes, truth(database_url))


def test_at_scale_every_cause_is_counted_and_the_pages_agree(postgresql_url: str) -> None:
    engine = sa.create_engine(postgresql_url)
    with engine.begin() as conn:
        conn.execute(sa.text(FILL))
    engine.dispose()
    true = truth(postgresql_url)
    assert true[MISSING] == 70008 and true[NO_ROUTE] == 40001 and len(true) == 1003
    reads, hurried = ConsoleReads(postgresql_url, UNHURRIED), ConsoleReads(postgresql_url, HURRIED)
    try:
        overview, offered = reads.overview(), reads.cause_names()  # the rows page's list
        every = reads.overview(CONSOLE_CAUSES_FOUND).causes  # the "other causes" line's link
        bound = reads.now()
        confirmed = {
            g.cause: reads.count(ParkedFilter(cause=g.cause), bound)
            for g in overview.causes.listed[:3]
        }
        hurried_causes = hurried.overview().causes
        rare = next(c for c in true if c not in {g.cause for g in overview.causes.listed})
        rare_rows, _ = reads.page(parked_filter({"cause": rare}, bound), None, 10)
    finally:
        reads.close()
        hurried.close()
    causes = overview.causes
    accounted(causes, true)
    accounted(hurried_causes, true)
    assert causes.parked == Counted(118009) and causes.other_causes == Counted(1003 - 50)
    assert [(g.cause, g.rows) for g in causes.listed[:3]] == [
        (MISSING, Counted(70008)),
        (NO_ROUTE, Counted(40001)),
        ("timeout: no confirm in # ms from node '…'", Counted(5000)),
    ]
    # The rows page offers the first causes of the index, without walking the rows.
    names, offered_all = offered
    assert len(names) == CAUSES_LISTED and not offered_all and set(names) <= set(true)
    # Every cause, listed on its own line each.
    assert {g.cause: g.rows.rows for g in every.listed} == true
    assert every.other_causes == Counted(0)
    assert confirmed == {g.cause: g.rows for g in causes.listed[:3]}
    # The walk stopped after 1,000 rows; every cause is listed all the same (the index of
    # causes), those it did not reach "more than 0".
    assert str(hurried_causes.parked) == "more than 1000"
    assert hurried_causes.other_causes == Counted(1003 - 50)
    assert [cause_of(r.last_error) for r in rare_rows] == [rare] * 3


def test_a_change_by_cause_takes_every_row_of_it_past_the_counts_budget(
    database_url: str,
) -> None:
    """The overview's walk stops before the oldest rows of a cause, whose errors name other
    exchanges (other reasons): a replay by that cause still takes each of them, and none of
    another cause; the confirmation says at least what it counted, the audit what it did."""
    old = [
        *park(
            database_url,
            [{"message_id": f"o{i}", "exchange": f"tenant-{i}"} for i in range(6)],
            "failed: 404 NOT_FOUND - no exchange '{}' in vhost '/'",
            ago=3 * SETTLED,
        )
    ]
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:  # an error text of its own per row
        conn.execute(
            sa.update(outbox)
            .where(outbox.c.id.in_(old))
            .values(last_error=sa.func.replace(outbox.c.last_error, "{}", outbox.c.exchange))
        )
    other = park(database_url, [{"message_id": f"n{i}"} for i in range(4)], NO_ROUTE, ago=SETTLED)
    recent = park(
        database_url,
        [{"message_id": f"r{i}"} for i in range(3)],
        "failed: 404 NOT_FOUND - no exchange 'orders' in vhost '/'",
        ago=SETTLED,
    )
    hurried = ConsoleReads(database_url, Budget(seconds=0, chunk=5))
    actions = ConsoleActions(database_url)
    try:
        causes = hurried.overview().causes
        bound = hurried.now()
        late = park(
            database_url,
            [{"message_id": "late"}],
            "failed: 404 NOT_FOUND - no exchange 'late' in vhost '/'",
        )
        within = hurried.count(ParkedFilter(cause=MISSING), bound)
        since = actions.left_after(ParkedFilter(cause=MISSING), bound)
        result = actions.replay(Actor("otto", "operator"), None, ParkedFilter(cause=MISSING), bound)
        with engine.connect() as conn:
            (entry,) = conn.execute(sa.select(console_audit)).all()
    finally:
        hurried.close()
        actions.close()
        engine.dispose()
    # The walk read none of the old rows: a change by the reasons it read would have left
    # all 6.
    assert not causes.parked.exact
    assert not within.exact and within.rows < len(old + recent)
    assert since == LeftAfter(1, tuple(late))
    assert (result.changed, result.left, result.parked_since) == (9, 0, 1)
    assert statuses_of(database_url, old + recent + other + late) == {
        **dict.fromkeys(old + recent, "pending"),
        **dict.fromkeys(other + late, "parked"),
    }
    assert (entry.rows, entry.result) == (9, f"done; left 1 parked after the bound: ids {late[0]}")
