"""The Spark writer: DataFrames into the outbox through JDBC, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
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
from relay.spark import WriteResult, register, write_outbox
from relay.tracing import trace_ids
from tests.support.inprocess import Running, rows_by_status, settings, wait_for
from tests.support.spark_drivers import stage_tables


def orders(spark: SparkSession, n: int, partitions: int = 4):  # type: ignore[no-untyped-def]
    rows = [(i, ["created", "paid", "shipped"][i % 3], 1000 + i, f"t{i % 2}") for i in range(n)]
    df = spark.createDataFrame(rows, "order_id long, event string, cents long, tenant string")
    return df.repartition(partitions).select(
        "order_id",
        "event",
        F.struct("order_id", "event", "cents").alias("body"),
        F.create_map(F.lit("tenant"), F.col("tenant")).alias("meta"),
    )


@pytest.mark.databases("sqlite", "postgresql")
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
    assert (result.rows, result.inserted) == (60, 60)

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


@dataclass(frozen=True)
class Expr:
    """A Column argument in a parametrisation (made when the test runs, in a session)."""

    sql: str


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"payload": "nope"}, "column 'nope' not found"),
        ({"payload": "order_id"}, "column 'order_id' has type bigint: the payload must be"),
        ({"headers": "event"}, "column 'event': headers are not valid JSON"),
        (
            {"routing_key": Expr("repeat('r', 256)")},
            "routingKey is 256 bytes; AMQP allows at most 255",
        ),
        ({"exchange": "e" * 256}, "option exchange is 256 bytes"),
        ({"message_id_prefix": "p" * 200}, "option messageIdPrefix is 264 bytes"),
        (
            {"content_type": Expr("string(null)")},
            "column '__outbox_contentType' \\(contentType\\) is null",
        ),
        ({"max_payload_bytes": 10}, "column 'body' is \\d+ bytes, larger than maxPayloadBytes 10"),
        ({"payload": "meta", "headers": None}, None),  # a map payload is sent as JSON
        ({"headers": "order_id"}, "column 'order_id' has type bigint: headers must be"),
        ({"key": []}, "pass key columns or a run_id"),
        ({"run_id": "r"}, "pass key columns or a run_id, not both"),
        ({"traceparent": "00-junk-01"}, "option traceparent/tracestate: '00-junk-01' is not a"),
        # A misspelt column: the relay's InputError, as for a missing payload column.
        ({"routing_key": Expr("rout")}, "option routingKey: Spark cannot compute the column: "),
        ({"ordering_key": Expr("nope")}, "option orderingKey: Spark cannot compute the column: "),
    ],
)
def test_bad_dataframes_are_refused_before_anything_is_written(
    spark: SparkSession, sqlite_url: str, change: dict[str, object], message: str | None
) -> None:
    args: dict[str, object] = {"payload": "body", "key": ["order_id", "event"], **change}
    args = {k: F.expr(v.sql) if isinstance(v, Expr) else v for k, v in args.items()}
    if message is None:
        write_outbox(orders(spark, 3), sqlite_url, **args)  # type: ignore[arg-type]
        return
    with pytest.raises(InputError, match=message):
        write_outbox(orders(spark, 3), sqlite_url, **args)  # type: ignore[arg-type]
    assert outbox_rows(sqlite_url) == []


@pytest.mark.parametrize("atomic", [False, True])
@pytest.mark.databases("sqlite", "postgresql")
def test_a_null_payload_is_refused_and_never_written(
    spark: SparkSession, database_url: str, atomic: bool
) -> None:
    """Atomic: nothing is written. Default: the partitions without the bad row may be, and
    the error says so; the re-run of the fixed data then writes each message once."""
    good = orders(spark, 10)
    df = good.withColumn("body", F.when(F.col("order_id") == 3, None).otherwise(F.col("body")))
    with pytest.raises(InputError) as raised:
        write_outbox(df, database_url, payload="body", key=["order_id"], atomic=atomic)
    message = str(raised.value)
    assert message.startswith("column 'body' is null: every message needs a payload"), message
    written = {json.loads(r.payload)["order_id"] for r in outbox_rows(database_url)}
    assert 3 not in written
    if atomic:
        assert written == set()
        assert message.endswith("nothing of this write is in the outbox (atomic)"), message
    else:
        found = re.search(r"at least (\d+) rows of partitions that finished first", message)
        assert found is not None, message
        assert int(found[1]) <= len(written)
    assert stage_tables(database_url) == []
    rerun = write_outbox(good, database_url, payload="body", key=["order_id"], atomic=atomic)
    assert rerun.inserted == 10 - len(written)
    rows = outbox_rows(database_url)
    assert sorted(json.loads(r.payload)["order_id"] for r in rows) == list(range(10))


@pytest.mark.parametrize("atomic", [False, True])
def test_with_an_ordering_key_each_keys_ids_follow_the_dataframes_order(
    spark: SparkSession, database_url: str, atomic: bool
) -> None:
    """Sorted descending, so that neither the input's nor message_id order would pass."""
    df = orders(spark, 40).withColumn("seq", -F.col("order_id")).orderBy("seq")
    write_outbox(
        df,
        database_url,
        payload="body",
        key=["order_id"],
        ordering_key=F.col("order_id") % 3,
        atomic=atomic,
    )
    for k in range(3):
        in_id_order = [
            json.loads(r.payload)["order_id"]
            for r in outbox_rows(database_url)
            if r.ordering_key == str(k)
        ]
        assert in_id_order == [i for i in range(39, -1, -1) if i % 3 == k]


def test_an_atomic_write_without_ordering_key_inserts_in_message_id_order(
    spark: SparkSession, database_url: str
) -> None:
    """The unique index fills from one end: the faster merge."""
    write_outbox(orders(spark, 40), database_url, payload="body", key=["order_id"], atomic=True)
    ids = [r.message_id for r in outbox_rows(database_url)]
    assert len(ids) == 40
    assert ids == sorted(ids)


def test_an_atomic_write_over_rows_already_there_adds_only_the_new_ones(
    spark: SparkSession, database_url: str
) -> None:
    """The merge's plain INSERT meets the ids already there and is done again ignoring them."""
    first = write_outbox(orders(spark, 30), database_url, payload="body", key=["order_id"])
    assert first.inserted == 30
    again = orders(spark, 45)
    assert write_outbox(again, database_url, payload="body", key=["order_id"], atomic=True) == (
        WriteResult(rows=45, inserted=15)
    )
    rows = outbox_rows(database_url)
    assert sorted(json.loads(r.payload)["order_id"] for r in rows) == list(range(45))


@pytest.mark.parametrize("atomic", [False, True])
def test_unmigrated_database_says_to_run_migrate(
    spark: SparkSession, tmp_path: Path, atomic: bool
) -> None:
    """write_outbox checks on the driver; format("outbox") alone checks in Spark's planner."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    with pytest.raises(SchemaMissingError, match="run `relay migrate`"):
        write_outbox(orders(spark, 3), url, payload="body", key=["order_id"], atomic=atomic)
    register(spark)
    write = (
        orders(spark, 3)
        .write.format("outbox")
        .options(url=url, payload="body", key="order_id", atomic=str(atomic).lower())
    )
    with pytest.raises(Exception, match=r"SchemaMissingError: .*run `relay migrate`"):
        write.mode("append").save()
    engine = sa.create_engine(url)
    try:  # no staging table either
        assert sa.inspect(engine).get_table_names() == []
    finally:
        engine.dispose()


@pytest.mark.databases("sqlite", "postgresql")
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


def test_run_id_identifies_rows_by_content_whatever_the_partitioning(
    spark: SparkSession, database_url: str
) -> None:
    """Three identical rows are three messages; a re-run after another repartition (and so
    another row order and placement) adds nothing."""
    rows = [(i % 7, f"e{i % 5}") for i in range(200)] + [(99, "same")] * 3
    df = spark.createDataFrame(rows, "n long, event string").select(
        F.to_json(F.struct("n", "event")).alias("payload"), "n", "event"
    )
    first = write_outbox(df.repartition(3), database_url, run_id="job-1")
    assert first.inserted == 203
    for again in (df.repartition(5), df.repartition(1, "event"), df.coalesce(1).orderBy("n")):
        assert write_outbox(again, database_url, run_id="job-1").inserted == 0
    assert write_outbox(df, database_url, run_id="job-2").inserted == 203
    assert len({r.message_id for r in outbox_rows(database_url)}) == 406


@pytest.mark.databases("sqlite", "postgresql")
def test_key_ids_do_not_depend_on_the_session_time_zone(
    spark: SparkSession, database_url: str
) -> None:
    df = spark.sql(
        "SELECT id, timestamp'2026-03-29 01:30:00+00:00' + make_interval(0, 0, 0, 0, id) AS ts,"
        " to_json(named_struct('id', id)) AS payload FROM range(50)"
    )
    zone = spark.conf.get("spark.sql.session.timeZone")
    assert zone is not None
    try:
        spark.conf.set("spark.sql.session.timeZone", "Europe/Berlin")
        assert write_outbox(df, database_url, key=["id", "ts"]).inserted == 50
        spark.conf.set("spark.sql.session.timeZone", "America/New_York")
        assert write_outbox(df, database_url, key=["id", "ts"]).inserted == 0
    finally:
        spark.conf.set("spark.sql.session.timeZone", zone)


def test_values_that_used_to_collide_are_distinct_messages(
    spark: SparkSession, database_url: str
) -> None:
    rows = [("x\x1fy", "z"), ("x", "y\x1fz"), (None, "a"), ("\x00null", "a"), ("", "a")]
    df = spark.createDataFrame(rows, "a string, b string").withColumn("payload", F.lit("p"))
    result = write_outbox(df, database_url, key=["a", "b"])
    assert (result.rows, result.inserted) == (5, 5)


@pytest.mark.databases("sqlite", "postgresql")
def test_format_outbox_is_the_spark_way_to_write(spark: SparkSession, database_url: str) -> None:
    register(spark)
    df = orders(spark, 12).withColumn("rk", F.concat(F.lit("order."), F.col("event")))
    (
        df.write.format("outbox")
        .option("url", database_url)
        .option("payload", "body")
        .option("exchange", "orders")
        .option("routingKeyColumn", "rk")
        .option("headers", "meta")
        .option("key", "order_id, event")
        .mode("append")
        .save()
    )
    rows = outbox_rows(database_url)
    assert len(rows) == 12
    assert {r.exchange for r in rows} == {"orders"}
    assert {r.routing_key for r in rows} == {"order.created", "order.paid", "order.shipped"}
    assert all(
        json.loads(r.headers or "") == {"tenant": f"t{i % 2}"}
        for i, r in [(json.loads(r.payload)["order_id"], r) for r in rows]
    )
    # The same key through write_outbox is the same message: nothing new.
    again = write_outbox(df, database_url, payload="body", key=["order_id", "event"])
    assert again.inserted == 0


def test_messages_carry_the_writers_trace_context_which_is_not_part_of_their_identity(
    spark: SparkSession, sqlite_url: str
) -> None:
    """From the driver's current span, from a value, or from a column (a bad one is left out)."""
    from opentelemetry.sdk.trace import TracerProvider

    trace_id, span_id = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    given = f"00-{trace_id}-{span_id}-01"
    df = orders(spark, 4, partitions=1).withColumn(
        "tp", F.when(F.col("order_id") == 0, F.lit("junk")).otherwise(F.lit(given))
    )
    run = {"payload": "body", "headers": "meta", "run_id": "traced"}
    driver = TracerProvider(shutdown_on_exit=False).get_tracer("job")
    with driver.start_as_current_span("nightly export") as span:
        assert write_outbox(df.drop("tp"), sqlite_url, **run).inserted == 4  # type: ignore[arg-type]
        current = span.get_span_context()
    headers = [json.loads(r.headers) for r in outbox_rows(sqlite_url)]
    assert {h["tenant"] for h in headers} == {"t0", "t1"}
    assert {trace_ids(h["traceparent"]) for h in headers} == {
        (f"{current.trace_id:032x}", f"{current.span_id:016x}")
    }
    # Another trace, the same rows: the same messages (a re-run is traced anew, not re-sent).
    again = write_outbox(df.drop("tp"), sqlite_url, **run, traceparent=given, tracestate="k=v")  # type: ignore[arg-type]
    assert again.inserted == 0
    assert (
        write_outbox(
            df, sqlite_url, payload="body", key=["order_id"], traceparent=F.col("tp")
        ).inserted
        == 4
    )
    by_order = {
        json.loads(r.payload)["order_id"]: json.loads(r.headers or "{}")
        for r in outbox_rows(sqlite_url)[4:]
    }
    assert by_order[0] == {}
    assert {by_order[i]["traceparent"] for i in (1, 2, 3)} == {given}
