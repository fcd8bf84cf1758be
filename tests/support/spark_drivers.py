"""Spark drivers the tests start as processes of their own (``tests/spark/driver.py``), and
what they look at afterwards: the rows a driver wrote, the staging tables it left.

Each driver runs in a process group of its own: a kill takes the whole group (the Python
driver, Spark's JVM and its Python workers) at once, as losing the machine or the container
would.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import sqlalchemy as sa

from devtools.outbox import rows as outbox_rows

# A driver's job takes 20 to 60 s alone; beside the suite's other processes on two cores,
# JVMs get a sixth of a core and took over 180 s (CI runs failed so): a bound on a hang.
DRIVER_TIMEOUT_S = 420


def start(*args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark.driver", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def finish(driver: subprocess.Popen[bytes]) -> None:
    _, err = driver.communicate(timeout=DRIVER_TIMEOUT_S)
    assert driver.returncode == 0, err.decode(errors="replace")[-3000:]


def kill_when(driver: subprocess.Popen[bytes], ready: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DRIVER_TIMEOUT_S
    while not ready():
        assert driver.poll() is None, driver.communicate()[1].decode(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the driver never got there"
        time.sleep(0.2)
    os.killpg(driver.pid, signal.SIGKILL)
    driver.communicate()


def counts(url: str, field: str) -> collections.Counter[int]:
    """How many times each value of the payloads' ``field`` is in the outbox."""
    return collections.Counter(json.loads(r.payload)[field] for r in outbox_rows(url))


def stage_tables(url: str) -> list[str]:
    engine = sa.create_engine(url)
    try:
        return [t for t in sa.inspect(engine).get_table_names() if t.startswith("outbox_stage")]
    finally:
        engine.dispose()
