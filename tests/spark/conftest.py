"""One local SparkSession for the whole test session (starting one costs seconds), with the
MariaDB JDBC driver Debian ships (``libmariadb-java``) for Spark's own JDBC writer."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from pyspark.sql import SparkSession

from relay.spark import LOCAL_MODE_ENV

MARIADB_JDBC_JAR = "/usr/share/java/mariadb-java-client.jar"


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
