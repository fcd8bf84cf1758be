"""One local SparkSession for the whole test session (starting one costs seconds), with the
MariaDB JDBC driver Debian ships (``libmariadb-java``) for Spark's own JDBC writer; and a
Spark Connect server for the tests of the writer over Spark Connect, whose log a failing
test shows."""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from devtools.spark_connect import SparkConnectServer
from relay.spark import LOCAL_MODE_ENV

MARIADB_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"
# The Connect server's Python workers import this checkout's relay package, not another
# installed copy.
PROJECT_ROOT = Path(__file__).resolve().parents[2]
# Where each Connect server's log stood when a test began (by fixture name): its failure
# shows what they added.
LOG_FROM = pytest.StashKey[dict[str, int]]()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    for name, value in LOCAL_MODE_ENV.items():
        os.environ.setdefault(name, value)
    session = (
        SparkSession.builder.master("local[2,4]")  # 2 threads, a task may fail 3 times
        .appName("outbox-relay-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.jars", MARIADB_JDBC_JAR)
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkConnectServer]:
    server = SparkConnectServer(tmp_path_factory.mktemp("spark-connect"), [PROJECT_ROOT])
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test that used Connect servers shows what they logged meanwhile."""
    report = yield
    fixtures = getattr(item, "funcargs", {})
    servers = {n: s for n, s in fixtures.items() if isinstance(s, SparkConnectServer)}
    if report.when == "setup":
        item.stash[LOG_FROM] = {name: server.log_size() for name, server in servers.items()}
    elif report.failed:
        since = item.stash.get(LOG_FROM, {})
        for name, server in servers.items():
            report.sections.append((f"{name}'s log", server.log_tail(since.get(name, 0))))
    return report
