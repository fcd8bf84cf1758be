"""Drivers killed with SIGKILL mid-batch: streams replay exactly once, no leftovers remain.

Each driver is a process of its own (tests/spark/driver.py) started from here, in a
process group of its own. A kill takes the whole group (the Python driver, Spark's JVM and
its Python workers) at once, as losing the machine or the container would: killing only the
Python driver lets the JVM run the writer's abort on its way out, which is a kinder failure.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from devtools.outbox import rows as outbox_rows
from devtools.relayproc import relay, relay_env
from tests.support.spark_drivers import (
    DRIVER_TIMEOUT_S,
    counts,
    finish,
    kill_when,
    stage_tables,
    start,
)

# Drivers of their own, each bounded by DRIVER_TIMEOUT_S (tests/support/spark_drivers.py).
pytestmark = pytest.mark.timeout(900)


def test_a_file_stream_killed_mid_batch_and_restarted_writes_every_row_once(
    postgresql_url: str, tmp_path: Path
) -> None:
    """No key: rows are identified by the query, the micro-batch and their content. (On
    PostgreSQL only, for the time budget: SQLite takes the same writes in test_writer.py.)"""
    database_url = postgresql_url
    source = tmp_path / "in"
    source.mkdir()
    ids = range(400)
    for part in range(8):  # two files (two partitions) per micro-batch
        lines = [json.dumps({"id": i, "word": "same"}) for i in ids[part * 50 : part * 50 + 50]]
        (source / f"part-{part:02}.json").write_text("\n".join(lines))
    checkpoint = str(tmp_path / "checkpoint")
    driver = start("files", database_url, checkpoint, str(source))
    # Mid-batch: one of a batch's two partitions is in, the other (with a slow row) is not.
    kill_when(driver, lambda: len(counts(database_url, "id")) % 100 == 50)
    assert 0 < len(counts(database_url, "id")) < len(ids)
    finish(start("files", database_url, checkpoint, str(source)))
    after = counts(database_url, "id")
    assert sorted(after) == list(ids)
    assert set(after.values()) == {1}


def test_a_rate_stream_killed_and_restarted_replays_without_duplicates(
    postgresql_url: str, tmp_path: Path
) -> None:
    database_url = postgresql_url
    checkpoint = str(tmp_path / "checkpoint")
    kill_when(
        start("rate", database_url, checkpoint), lambda: len(outbox_rows(database_url)) >= 150
    )
    first = set(range(max(counts(database_url, "value")) + 1))
    # Restarted, the query replays the batch under way at the kill, then goes on.
    kill_when(
        start("rate", database_url, checkpoint), lambda: first <= set(counts(database_url, "value"))
    )
    assert set(counts(database_url, "value").values()) == {1}, "a replayed batch wrote rows twice"


@pytest.mark.databases("postgresql", "mariadb")
def test_an_atomic_write_killed_leaves_nothing_and_its_stage_is_purged_at_once(
    database_url: str,
) -> None:
    """The stage is dropped because its writer is gone (no one holds its lock), not because
    it is old: purges keep the default age of a day, and a live write's stage stays."""
    env = relay_env(RELAY_DATABASE_URL=database_url)
    driver = start("atomic", database_url, "2000")
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while not stage_tables(database_url):
        assert driver.poll() is None, driver.communicate()[1].decode(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the driver made no stage"
        time.sleep(0.2)
    live = relay("purge", "--older-than", "7d", env=env)
    assert live.returncode == 0, live.stderr
    assert len(stage_tables(database_url)) == 1, "a live write's stage was dropped"
    kill_when(driver, lambda: True)
    assert outbox_rows(database_url) == []  # nothing is visible before the merge
    assert len(stage_tables(database_url)) == 1
    deadline = time.monotonic() + 30
    while stage_tables(database_url):  # the killed driver's session ends, and its lock
        assert time.monotonic() < deadline, "the killed driver's stage stayed"
        purge = relay("purge", "--older-than", "7d", env=env)
        assert purge.returncode == 0, purge.stderr
        time.sleep(0.5)
    assert "dropped abandoned staging table outbox_stage_" in purge.stdout
