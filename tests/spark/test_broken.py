"""Writes that cannot run where Spark runs them: one clear error naming the cause, and
nothing half-written left visible.

Each driver is a process of its own (tests/spark/driver.py ``broken``): which Python Spark's
workers run, and their environment, are fixed when a SparkContext starts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from devtools.outbox import rows as outbox_rows
from tests.support.spark_drivers import DRIVER_TIMEOUT_S, stage_tables

# Drivers of their own, each bounded by DRIVER_TIMEOUT_S (tests/support/spark_drivers.py).
pytestmark = pytest.mark.timeout(900)


def errors(url: str, kind: str, scratch: Path) -> dict[bool, dict[str, str]]:
    """Each write's error (default, atomic) with the driver ``broken`` ``kind``."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.spark.driver", "broken", url, kind, str(scratch)],
        capture_output=True,
        text=True,
        timeout=DRIVER_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    return {line.pop("atomic"): line for line in lines}


def test_workers_without_the_package_say_where_to_install_it(
    postgresql_url: str, tmp_path: Path
) -> None:
    found = errors(postgresql_url, "without-relay", tmp_path)
    for atomic, error in found.items():
        assert error["error"] == "ConfigError", error
        message = error["message"]
        assert message.startswith("Spark's Python workers cannot import 'relay': install "), error
        assert "outbox-relay[spark]" in message and "spark.pyspark.python" in message, error
        if atomic:
            assert message.endswith("nothing of this write is in the outbox (atomic)"), error
    assert outbox_rows(postgresql_url) == []
    assert stage_tables(postgresql_url) == []


def test_executors_that_cannot_reach_the_database_say_so(
    postgresql_url: str, tmp_path: Path
) -> None:
    """The driver reaches the database (it checks the outbox first); the executors do not."""
    found = errors(postgresql_url, "unreachable", tmp_path)
    for atomic, error in found.items():
        assert error["error"] == "StoreError", error
        message = error["message"]
        assert 'connection to server at "127.0.0.2"' in message, error
        assert "Connection refused" in message, error
        assert "postgres@127.0.0.1" in message, error  # which database, without a password
        tail = (
            "nothing of this write is in the outbox (atomic)"
            if atomic
            else "at least 0 rows of partitions that finished first were committed; fix the cause"
        )
        assert tail in message, error
    assert outbox_rows(postgresql_url) == []
    assert stage_tables(postgresql_url) == []
