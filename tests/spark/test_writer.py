"""The Spark writer: DataFrames into the outbox through JDBC, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from devtools.broker import drain, names, simple_topology
from devtools.outbox import rows as outbox_rows
from devtools.servers import RabbitNode
from relay.errors import InputError, SchemaMissingError
from relay.spark import write_outbox
from tests.support.inprocess import Running, rows_by_status, settings, wait_for

pytestmark = pytest.mark.spark


def orders(spark: SparkSession, n: int, partitions: int = 4):  # type: ignore[no-untyped-def]
    rows = [(i, ["created", "paid", "shipped"][i % 3], 1000 + i, f"t{i % 2}") for i in range(n)]
    df = spark.createDataFrame(rows, "order_id long, event string, cents long, tenant string")
    return df.repartition(partitions).select(
        "order_id",
        "event",
        F.struct("order_id", "event", "cents").alias("body"),
        F.create_map(F.lit("tenant"), F.col("tenant")).alias("meta"),
    )


def test_dataframe_to_outbox_to_relay_to_consumer(
    spark: SparkSession, database_url: str, rabbit: RabbitNode
) -> None:
    exchange, queue = names("spark")
    df = orders(spark, 60)
    result = write_outbox(
        df,
        database_url,
        payload="body",
        exchange=exchange,
        routing_key=F.concat(F.lit("order."), F.col("event")),
        headers="meta",
        key=["order_id", "event"],
    )
    assert (result.staged, result.inserted) == (60, 60)

    async def relay_all() -> None:
        async with Running(
            settings(database_url, rabbit.url), simple_topology(exchange, queue)
        ) as parts:
            await wait_for(lambda: rows_by_status(parts) == {"sent": 60}, 60, "all rows sent")

    asyncio.run(relay_all())
    got = {json.loads(d.body)["order_id"]: d for d in drain(rabbit.url, queue, expect=60)}
    assert sorted(got) == list(range(60))
    for r in df.collect():
        d = got[r.order_id]
        assert json.loads(d.body) == {
            "order_id": r.order_id,
            "event": r.event,
            "cents": r.body.cents,
        }
        assert d.routing_key == f"order.{r.event}"
        assert d.headers == dict(r.meta)
        assert d.content_type == "application/json"


def test_task_retries_and_reruns_write_every_row_exactly_once(
    spark: SparkSession, database_url: str
) -> None:
    def fail_first_attempts(order_id: int) -> int:
        # The first attempt of every task fails after it has produced rows.
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None and ctx.attemptNumber() == 0 and order_id % 25 == 24:
            raise RuntimeError("injected task failure")
        return order_id

    flaky = F.udf(fail_first_attempts, T.LongType(), useArrow=False)
    df = orders(spark, 200).withColumn("order_id", flaky(F.col("order_id")))
    first = write_outbox(df, database_url, payload="body", key=["order_id", "event"])
    assert first.inserted == 200
    rows = outbox_rows(database_url)
    assert len(rows) == 200 == len({r.message_id for r in rows})
    assert sorted(json.loads(r.payload)["order_id"] for r in rows) == list(range(200))
    again = write_outbox(df, database_url, payload="body", key=["order_id", "event"])
    assert again.inserted == 0
    assert len(outbox_rows(database_url)) == 200


def test_run_id_makes_a_rerun_a_no_op_without_key_columns(
    spark: SparkSession, database_url: str
) -> None:
    df = orders(spark, 30)
    assert write_outbox(df, database_url, payload="body", run_id="orders-2026-11-22").inserted == 30
    assert write_outbox(df, database_url, payload="body", run_id="orders-2026-11-22").inserted == 0
    assert write_outbox(df, database_url, payload="body", run_id="orders-2026-11-23").inserted == 30


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"payload": "nope"}, "column 'nope' not found"),
        ({"payload": "order_id"}, "column 'order_id' has type bigint: the payload must be"),
        ({"headers": "event"}, None),  # a string column of JSON is accepted
        ({"headers": "order_id"}, "column 'order_id' has type bigint: headers must be"),
        ({"key": []}, "pass key columns or a run_id"),
    ],
)
def test_bad_dataframes_are_refused_before_anything_is_written(
    spark: SparkSession, sqlite_url: str, change: dict[str, object], message: str | None
) -> None:
    args: dict[str, object] = {"payload": "body", "key": ["order_id", "event"], **change}
    if message is None:
        write_outbox(orders(spark, 3), sqlite_url, **args)  # type: ignore[arg-type]
        return
    with pytest.raises(InputError, match=message):
        write_outbox(orders(spark, 3), sqlite_url, **args)  # type: ignore[arg-type]
    assert outbox_rows(sqlite_url) == []


def test_null_payload_writes_nothing_and_leaves_no_staging_table(
    spark: SparkSession, database_url: str
) -> None:
    df = orders(spark, 10).withColumn(
        "body", F.when(F.col("order_id") == 3, None).otherwise(F.col("body"))
    )
    with pytest.raises(InputError, match="column 'body': 1 rows have a null payload"):
        write_outbox(df, database_url, payload="body", key=["order_id"])
    assert outbox_rows(database_url) == []
    engine = sa.create_engine(database_url)
    assert [t for t in sa.inspect(engine).get_table_names() if t.startswith("outbox_stage")] == []
    engine.dispose()


def test_with_an_ordering_key_ids_follow_the_dataframes_order(
    spark: SparkSession, database_url: str
) -> None:
    """Sorted descending, so that neither the input's nor message_id order would pass."""
    df = orders(spark, 40).withColumn("seq", -F.col("order_id")).orderBy("seq")
    write_outbox(
        df, database_url, payload="body", key=["order_id"], ordering_key=F.col("order_id") % 3
    )
    in_id_order = [json.loads(r.payload)["order_id"] for r in outbox_rows(database_url)]
    assert in_id_order == list(range(39, -1, -1))
    # Without an ordering key the rows go in message_id order (the faster merge).
    write_outbox(df, database_url, payload="body", key=["order_id"], message_id_prefix="u-")
    unordered = [r.message_id for r in outbox_rows(database_url) if r.message_id[:2] == "u-"]
    assert unordered == sorted(unordered)


def test_unmigrated_database_says_to_run_migrate(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(SchemaMissingError, match="run `relay migrate`"):
        write_outbox(
            orders(spark, 3), f"sqlite:///{tmp_path / 'new.db'}", payload="body", key=["order_id"]
        )


def test_content_type_and_ordering_key_come_from_values_or_columns(
    spark: SparkSession, database_url: str
) -> None:
    df = orders(spark, 6)
    write_outbox(
        df,
        database_url,
        payload="body",
        key=["order_id"],
        content_type=F.concat(F.lit("application/vnd."), F.col("event"), F.lit("+json")),
        ordering_key=F.col("order_id") % 2,
    )
    write_outbox(
        df,
        database_url,
        payload="body",
        key=["order_id"],
        message_id_prefix="b-",
        content_type="application/x-order",
        ordering_key="all",
    )
    rows = outbox_rows(database_url)
    by_column = {json.loads(r.payload)["order_id"]: r for r in rows if r.message_id[:2] != "b-"}
    for r in df.collect():
        got = by_column[r.order_id]
        assert got.content_type == f"application/vnd.{r.event}+json"
        assert got.ordering_key == str(r.order_id % 2)
    by_value = [r for r in rows if r.message_id[:2] == "b-"]
    assert len(by_value) == 6
    assert {(r.content_type, r.ordering_key) for r in by_value} == {("application/x-order", "all")}
    without = write_outbox(
        orders(spark, 2), database_url, payload="body", key=["order_id"], message_id_prefix="c-"
    )
    assert without.inserted == 2
    assert {r.ordering_key for r in outbox_rows(database_url) if r.message_id[:2] == "c-"} == {None}
