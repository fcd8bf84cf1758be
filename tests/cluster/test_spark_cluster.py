"""The writer where Spark really runs: a standalone cluster, a master and two workers as JVMs of
their own on two loopback addresses (devtools.spark_cluster), a driver process submitting to
it (tests/spark/driver.py). What Spark did is read from its own event log, not guessed from
timing."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from devtools.outbox import rows as outbox_rows
from devtools.spark_cluster import SparkCluster
from tests.spark.driver import PARTITIONS
from tests.support.spark_drivers import DRIVER_TIMEOUT_S, counts, finish, stage_tables, start

# Drivers of their own, each bounded by DRIVER_TIMEOUT_S (tests/support/spark_drivers.py).
pytestmark = pytest.mark.timeout(900)

ROWS = 1600


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SparkCluster]:
    made = SparkCluster(tmp_path / "cluster")
    try:
        made.start()
        yield made
    finally:
        made.stop()


def events(directory: Path) -> list[dict[str, Any]]:
    """Every event of the applications' event logs in ``directory``."""
    return [
        json.loads(line) for log in directory.iterdir() for line in log.read_text().splitlines()
    ]


def idle_in_transaction(url: str) -> int:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            query = (
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE starts_with(state, 'idle in transaction')"
            )
            return int(conn.exec_driver_sql(query).scalar_one())
    finally:
        engine.dispose()


def test_a_worker_killed_mid_write_leaves_every_row_once(
    cluster: SparkCluster, postgresql_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "events"
    log.mkdir()
    driver = start("cluster", postgresql_url, cluster.master_url, str(ROWS), str(log))
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    # Some partitions committed, the job not done: both workers are running tasks.
    while not 0 < len(outbox_rows(postgresql_url)) < ROWS:
        assert driver.poll() is None, driver.communicate()[1].decode(errors="replace")[-3000:]
        assert time.monotonic() < deadline, cluster.logs()
        time.sleep(0.2)
    cluster.kill_worker(1)
    finish(driver)

    assert counts(postgresql_url, "id") == collections.Counter(range(ROWS))
    assert stage_tables(postgresql_url) == []
    deadline = time.monotonic() + 30
    while idle_in_transaction(postgresql_url):  # the killed executor's sessions end
        assert time.monotonic() < deadline, "a transaction of the killed executor stayed open"
        time.sleep(0.2)
    lost = [
        e
        for e in events(log)
        if e["Event"] == "SparkListenerTaskEnd"
        and e["Task End Reason"]["Reason"] == "ExecutorLostFailure"
    ]
    assert lost, "no task was running on the killed worker"
    assert {e["Task Info"]["Host"] for e in lost} == {"127.0.0.2"}


def test_a_speculative_copy_of_a_stalled_task_writes_nothing_twice(
    cluster: SparkCluster, postgresql_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "events"
    log.mkdir()
    finish(start("speculate", postgresql_url, cluster.master_url, str(ROWS), str(log)))

    assert counts(postgresql_url, "id") == collections.Counter(range(ROWS))
    logged = events(log)
    started = [
        (e["Stage ID"], e["Task Info"]) for e in logged if e["Event"] == "SparkListenerTaskStart"
    ]
    copies = [(stage, task) for stage, task in started if task["Speculative"]]
    assert copies, "Spark ran no speculative copy"
    # The copy ran on the other host, and it is the copy that finished the stalled task.
    stage, copy = copies[0]
    (stalled,) = [
        task
        for s, task in started
        if s == stage and task["Index"] == copy["Index"] and not task["Speculative"]
    ]
    assert copy["Host"] != stalled["Host"]
    ended = {
        e["Task Info"]["Task ID"]: e["Task End Reason"]["Reason"]
        for e in logged
        if e["Event"] == "SparkListenerTaskEnd"
    }
    assert ended[copy["Task ID"]] == "Success"
    assert len([s for s, _ in started if s == stage]) == PARTITIONS + len(copies)
