"""The Spark writer from a Spark Connect client: ``SparkSession.builder.remote`` to a local
Connect server (devtools.spark_connect), which plans and runs the writes in its own JVM and
Python workers. The rows that arrive are the ones the classic tests expect, ids included,
and the writer's errors reach the client."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import pytest
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.connect.dataframe import DataFrame as ConnectDataFrame
from pyspark.sql.connect.session import SparkSession as ConnectSession

from devtools.outbox import rows as outbox_rows
from devtools.spark_connect import SparkConnectServer
from relay.errors import ConfigError, InputError
from relay.identity import message_id
from relay.spark import WriteResult, register, write_outbox
from tests.support.spark_drivers import stage_tables

ROWS = 12
EVENTS = ("created", "paid", "shipped")
# Binary payloads, not UTF-8: the bytes must cross the client's Arrow batches unchanged.
OCTETS = "application/octet-stream"
# Runs a module in a Python that cannot import the relay package.
WITHOUT_RELAY = Path(__file__).with_name("without_relay.py")


@contextmanager
def client(server: SparkConnectServer) -> Iterator[SparkSession]:
    """A Connect client session of ``server``: the one ``SparkSession.builder.remote(url)``
    makes, by the Connect builder it hands over to. Not through that public builder, which
    refuses a remote session in a process running a classic one (SESSION_ALREADY_EXIST):
    the classic tests' session, when this process ran them first. The public builder also
    marks the whole process a Connect client (SPARK_CONNECT_MODE_ENABLED, which
    pyspark.sql.functions follow) for good: done here while the session lives only, for
    the classic tests this process may run next."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_CONNECT_MODE_ENABLED", "1")
        session = ConnectSession.builder.remote(server.url).create()
        try:
            # Typed as the public builder types it, as in a user's code.
            yield cast(SparkSession, session)
        finally:
            session.stop()


@pytest.fixture(scope="module")
def remote(connect_server: SparkConnectServer) -> Iterator[SparkSession]:
    with client(connect_server) as session:
        yield session


@pytest.fixture
def server_without_relay(tmp_path: Path) -> Iterator[SparkConnectServer]:
    """A Connect server whose Python workers cannot import this package, as one where
    outbox-relay was never installed."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{WITHOUT_RELAY}" "$@"\n')
    python.chmod(0o755)
    server = SparkConnectServer(tmp_path / "server", python=str(python))
    server.start()
    try:
        yield server
    finally:
        server.stop()


def body(i: int) -> bytes:
    return bytes([i, 0, 0xFF]) + f"order-{i}".encode()


def orders(spark: SparkSession, n: int = ROWS) -> DataFrame:
    rows = [(i, EVENTS[i % 3], body(i), f"t{i % 2}") for i in range(n)]
    df = spark.createDataFrame(rows, "order_id long, event string, body binary, tenant string")
    made = df.repartition(4).select(
        "order_id",
        "event",
        "body",
        F.create_map(F.lit("tenant"), F.col("tenant")).alias("meta"),
    )
    assert isinstance(made, ConnectDataFrame), type(made)
    return made


def expected(exchange: str, prefix: str = "", n: int = ROWS) -> dict[str, tuple[Any, ...]]:
    """The rows ``orders(n)`` makes, by message id (its key: order_id and event), as the
    classic writer computes it (relay.identity)."""
    return {
        message_id(["key", i, EVENTS[i % 3]], prefix): (
            body(i),
            exchange,
            f"order.{EVENTS[i % 3]}",
            OCTETS,
            {"tenant": f"t{i % 2}"},
        )
        for i in range(n)
    }


def arrived(url: str) -> dict[str, tuple[Any, ...]]:
    return {
        r.message_id: (
            bytes(r.payload),
            r.exchange,
            r.routing_key,
            r.content_type,
            json.loads(r.headers),
        )
        for r in outbox_rows(url)
    }


@pytest.mark.databases("sqlite", "postgresql")
def test_format_outbox_writes_every_row_once(remote: SparkSession, database_url: str) -> None:
    register(remote)
    df = orders(remote).withColumn("rk", F.concat(F.lit("order."), F.col("event")))
    for _ in range(2):  # the second write adds nothing: the same ids
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
        assert arrived(database_url) == expected("orders")
    assert len(outbox_rows(database_url)) == ROWS


@pytest.mark.parametrize("atomic", [False, True])
@pytest.mark.databases("sqlite", "postgresql")
def test_write_outbox_writes_every_row_once(
    remote: SparkSession, database_url: str, atomic: bool
) -> None:
    args: dict[str, Any] = {
        "payload": "body",
        "exchange": "orders",
        "routing_key": F.concat(F.lit("order."), F.col("event")),
        "headers": "meta",
        "key": ["order_id", "event"],
        "message_id_prefix": "w-",
        "atomic": atomic,
    }
    assert write_outbox(orders(remote), database_url, **args) == WriteResult(ROWS, ROWS)
    assert arrived(database_url) == expected("orders", "w-")
    assert write_outbox(orders(remote), database_url, **args) == WriteResult(ROWS, 0)
    assert len(outbox_rows(database_url)) == ROWS
    assert stage_tables(database_url) == []


def test_run_id_numbers_identical_rows_on_the_server(remote: SparkSession, sqlite_url: str) -> None:
    """write_outbox's window over all columns, planned by the Connect server: three identical
    rows are three messages, and a re-run adds nothing."""
    df = orders(remote, 4).unionByName(orders(remote, 1)).unionByName(orders(remote, 1))
    assert write_outbox(df, sqlite_url, payload="body", run_id="nightly") == WriteResult(6, 6)
    assert write_outbox(df, sqlite_url, payload="body", run_id="nightly") == WriteResult(6, 0)
    payloads = sorted(bytes(r.payload) for r in outbox_rows(sqlite_url))
    assert payloads == sorted([body(0), body(0), body(0), body(1), body(2), body(3)])


def test_a_bad_option_of_format_outbox_reaches_the_client(
    remote: SparkSession, sqlite_url: str
) -> None:
    """Refused by the data source's planner, on the server: the client's error says why."""
    register(remote)
    write = (
        orders(remote)
        .write.format("outbox")
        .options(url=sqlite_url, payload="body", key="order_id", atomic="maybe")
    )
    with pytest.raises(AnalysisException, match="option atomic must be true or false, not 'maybe'"):
        write.mode("append").save()
    assert outbox_rows(sqlite_url) == []


def test_a_missing_column_is_refused_by_write_outbox(remote: SparkSession, sqlite_url: str) -> None:
    with pytest.raises(InputError, match="column 'nope' not found"):
        write_outbox(orders(remote), sqlite_url, payload="nope", key=["order_id"])
    assert outbox_rows(sqlite_url) == []


@pytest.mark.parametrize("atomic", [False, True])
def test_a_bad_value_in_a_task_is_the_relays_error_on_the_client(
    remote: SparkSession, postgresql_url: str, atomic: bool
) -> None:
    """Found by a task on the server, its text relayed by Connect: write_outbox raises the
    relay's InputError with what the write left, as in classic mode."""
    with pytest.raises(InputError) as raised:
        write_outbox(
            orders(remote),
            postgresql_url,
            payload="body",
            key=["order_id"],
            max_payload_bytes=len(body(9)),  # orders 10 and 11 are a byte longer
            atomic=atomic,
        )
    message = str(raised.value)
    assert re.match(r"column 'body' is 11 bytes, larger than maxPayloadBytes 10 ", message), message
    left = {bytes(r.payload) for r in outbox_rows(postgresql_url)}
    assert left <= {body(i) for i in range(10)}
    if atomic:
        assert message.endswith("nothing of this write is in the outbox (atomic)"), message
        assert left == set()
    else:
        found = re.search(r"at least (\d+) rows of partitions that finished first", message)
        assert found is not None, message
        assert int(found[1]) <= len(left)
    assert stage_tables(postgresql_url) == []


def test_a_server_without_the_package_says_where_to_install_it(
    server_without_relay: SparkConnectServer, postgresql_url: str
) -> None:
    """The server's Python workers unpickle the data source by name: without the package,
    write_outbox's ConfigError says where it goes, as on a classic cluster."""
    with client(server_without_relay) as spark:
        for atomic in (False, True):
            with pytest.raises(ConfigError) as raised:
                write_outbox(
                    orders(spark), postgresql_url, payload="body", key=["order_id"], atomic=atomic
                )
            message = str(raised.value)
            assert message.startswith("Spark's Python workers cannot import 'relay': install "), (
                message
            )
            assert "outbox-relay[spark]" in message and "spark.pyspark.python" in message, message
    assert outbox_rows(postgresql_url) == []
    assert stage_tables(postgresql_url) == []
