"""The claim takes at most its limit, and asks which buckets are this relay's once, whatever
PostgreSQL's statistics say.

An outbox drained and purged (every row deleted), then vacuumed, has statistics that say
"empty" until the next ANALYZE. With rows loaded in bulk before that (a Spark job),
PostgreSQL ran the row-leasing claim of earlier versions, ``id IN (SELECT ... FOR UPDATE
SKIP LOCKED LIMIT n)``, as a nested loop over the whole table that ran the subquery again
for every row: a claim of 100 leased all 2,000 rows here, and over 100,000 rows every claim
hit the statement timeout (bench.run, three relays). The claim's subquery now is the owned
buckets'.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa

from devtools.outbox import insert
from relay.db.claims import ClaimStore
from relay.db.engine import create_engine

ROWS = 2000


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from nodes(child)


def statistics_say_empty(url: str) -> None:
    """Fill, purge and vacuum (keeping the pages, as a vacuum does while rows remain at the
    table's end): the table's row estimate is 0."""
    insert(url, [{"message_id": f"gone-{i}", "payload": b"x"} for i in range(ROWS)])
    engine = create_engine(url).execution_options(isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("DELETE FROM outbox"))
            conn.execute(sa.text("VACUUM (TRUNCATE false) outbox"))
            estimate = conn.scalar(
                sa.text("SELECT reltuples FROM pg_class WHERE relname = 'outbox'")
            )
    finally:
        engine.dispose()
    assert estimate == 0


def test_the_claims_bucket_subquery_runs_once(postgresql_url: str) -> None:
    statistics_say_empty(postgresql_url)
    insert(postgresql_url, [{"message_id": f"m-{i}", "payload": b"x"} for i in range(ROWS)])
    store = ClaimStore(postgresql_url, "relay-1", 60.0)
    store.turn()
    claims: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if "outbox_buckets" in statement and statement.startswith("SELECT"):
            claims.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", capture)
    try:
        assert len(store.claim(100, 2**62)) == 100
        [(statement, parameters)] = claims
        raw = store.engine.raw_connection()
        try:
            cursor = raw.cursor()
            cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, parameters)
            [[explained]] = cursor.fetchall()
            raw.rollback()
        finally:
            raw.close()
    finally:
        store.close()
    plan = explained[0]["Plan"]
    assert plan["Actual Rows"] == 100
    [buckets] = [n for n in nodes(plan) if n.get("Relation Name") == "outbox_buckets"]
    assert buckets["Actual Loops"] == 1
