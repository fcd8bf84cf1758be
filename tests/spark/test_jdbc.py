"""Spark's own JDBC writer into the outbox: the schema takes its rows as they come, on MariaDB
with the JDBC driver Debian ships."""

from __future__ import annotations

import sqlalchemy as sa
from pyspark.sql import SparkSession

from devtools.outbox import fates, statuses
from relay.db.claims import ClaimStore
from relay.db.outbox import OutboxAdmin
from relay.records import SettleBatch


def test_a_jdbc_append_is_relayed_and_its_rerun_after_the_acks_is_dropped_by_the_relay(
    spark: SparkSession, mariadb_url: str
) -> None:
    url = sa.make_url(mariadb_url)
    # jdbc:mysql:, which Debian's MariaDB driver takes too: Spark picks its SQL dialect by the
    # URL's prefix, and with jdbc:mariadb: quoted the columns as MariaDB refuses ("a").
    jdbc = f"jdbc:mysql://{url.host}:{url.port}/{url.database}"
    properties = {"user": url.username or "", "driver": "org.mariadb.jdbc.Driver"}
    rows = [
        (f"jdbc-{i}", "orders", "order.paid", bytearray(b"\x00\xff"), '{"n": 1}') for i in range(20)
    ]
    df = spark.createDataFrame(
        rows,
        "message_id string, exchange string, routing_key string, payload binary, headers string",
    ).repartition(2)
    df.write.jdbc(jdbc, "outbox", mode="append", properties=properties)
    assert statuses(mariadb_url) == {"pending": 20}

    store = ClaimStore(mariadb_url, "relay-1", 60.0)
    admin = OutboxAdmin(mariadb_url)
    try:
        store.turn()
        claimed = store.claim(100, 2**30)
        assert sorted(r.message_id for r in claimed) == sorted(r[0] for r in rows)
        assert {(r.payload, r.headers) for r in claimed} == {(b"\x00\xff", '{"n": 1}')}
        assert not any(r.sent_before for r in claimed)
        store.settle(SettleBatch(sent=tuple(r.id for r in claimed), changes=()))

        # Acked rows left the outbox for the sent log: the same append again goes in (a
        # plain INSERT, as on every database), and the relay drops every row unpublished.
        df.write.jdbc(jdbc, "outbox", mode="append", properties=properties)
        again = store.claim(100, 2**30)
        assert len(again) == 20 and all(r.sent_before for r in again)
        store.settle(SettleBatch(duplicates=tuple(r.id for r in again)))
        assert admin.status().duplicates == 20
    finally:
        store.close()
        admin.close()
    assert statuses(mariadb_url) == {"sent": 20}
    assert set(fates(mariadb_url, [r[0] for r in rows]).values()) == {"sent"}
