"""The rows page's search by message id prefix (``ParkedFilter.message_prefix``) on every
database: byte by byte, every value matched as text, the prefix's last possible character
included; and on PostgreSQL in a language collation, one range of the index of migration
0016, not a scan."""

from __future__ import annotations

import uuid

import pytest
import sqlalchemy as sa

from devtools.servers import PostgresServer
from relay.console_records import ParkedFilter
from relay.db.console import ConsoleReads, parked_where, prefix_end
from relay.db.console_counts import parked_time
from relay.db.console_rows import SUMMARY_COLUMNS
from relay.db.migrate import migrate
from relay.db.schema import outbox
from relay.records import PARKED
from tests.support.console import park

NO_ROUTE = "returned: 312 NO_ROUTE"
TOP = chr(0x10FFFF)
IDS = [
    "order-1",
    "order-12",
    "order-2",
    "Order-1",  # case counts
    "order",  # shorter than the prefix
    "ord%er-1",  # LIKE's wildcards are text
    "ord_er-1",
    "é-1",
    "é" + TOP,
    "éa",
    "ê",
    "ab-c",  # a language's collation puts it among "abc..."
    "abc",
]


@pytest.mark.parametrize(
    "prefix, found",
    [
        ("order-1", ["order-1", "order-12"]),
        ("ord%", ["ord%er-1"]),
        ("ord_", ["ord_er-1"]),
        ("é", ["é-1", "é" + TOP, "éa"]),
        ("é" + TOP, ["é" + TOP]),
        ("abc", ["abc"]),
        ("O", ["Order-1"]),
    ],
)
def test_a_prefix_finds_the_parked_rows_whose_message_id_starts_with_it(
    database_url: str, prefix: str, found: list[str]
) -> None:
    park(database_url, [{"message_id": m} for m in IDS], NO_ROUTE)
    reads = ConsoleReads(database_url)
    try:
        rows, _ = reads.page(ParkedFilter(message_prefix=prefix), None, 50)
    finally:
        reads.close()
    assert sorted(r.message_id for r in rows) == sorted(found)


def test_the_end_of_a_prefix_skips_surrogates_and_the_last_character() -> None:
    assert prefix_end("ab") == "ac"
    assert prefix_end("a" + chr(0xD7FF)) == "a" + chr(0xE000)
    assert prefix_end("a" + TOP + TOP) == "b"
    assert prefix_end(TOP) is None


def test_a_prefix_reads_one_range_of_the_index_in_a_language_collation(
    postgres: PostgresServer,
) -> None:
    """In a database whose collation is ICU's English (``ab-c`` sorts among ``abc…``, and
    LIKE 'p%' can use no B-tree index), 20,000 parked rows: the page of a prefix reads the
    message index of migration 0016, and finds the prefix's rows only."""
    name = f"icu_{uuid.uuid4().hex[:8]}"
    postgres.psql(
        f"CREATE DATABASE {name} LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C.UTF-8' "
        "TEMPLATE template0"
    )
    url = postgres.url(name)
    migrate(url)
    engine = sa.create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO outbox (message_id, exchange, routing_key, payload, status, "
                    "last_error, next_attempt_at) SELECT 'tenant-' || (i % 50) || '-order-' || i,"
                    " '', '', 'x', :parked, :reason, now() FROM generate_series(1, 20000) i"
                ),
                {"parked": PARKED, "reason": NO_ROUTE},
            )
            conn.execute(sa.text("ANALYZE outbox"))
        park(url, [{"message_id": "ab-c"}, {"message_id": "abc-1"}], NO_ROUTE)
        chosen = ParkedFilter(message_prefix="tenant-7-order-1235")
        page = (
            sa.select(*SUMMARY_COLUMNS)
            .where(*parked_where(chosen))
            .order_by(parked_time.desc(), outbox.c.id.desc())
            .limit(51)
        )
        with engine.connect() as conn:
            literal = page.compile(conn, compile_kwargs={"literal_binds": True})
            plan = "\n".join(conn.exec_driver_sql(f"EXPLAIN {literal}").scalars())
        reads = ConsoleReads(url)
        try:
            found, _ = reads.page(chosen, None, 50)
            abc, _ = reads.page(ParkedFilter(message_prefix="abc"), None, 50)
        finally:
            reads.close()
    finally:
        engine.dispose()
    assert "outbox_parked_message_idx" in plan, plan
    assert "Seq Scan" not in plan, plan
    assert [r.message_id for r in found] == ["tenant-7-order-12357"]
    assert [r.message_id for r in abc] == ["abc-1"]
