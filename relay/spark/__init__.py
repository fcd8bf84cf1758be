"""Spark DataFrames into the outbox: ``df.write.format("outbox")``, batch and streaming.

Install with the ``spark`` extra (PySpark 4.1+, pyarrow); the relay daemon never imports
this package. ``register(spark)`` makes ``format("outbox")`` known to a session;
``write_outbox`` is the same write as one Python call (it registers, turns Column arguments
into columns, and numbers identical rows for ``run_id``).

Spark re-runs failed tasks, runs speculative copies, replays a stream's micro-batch after a
restart, and people re-run whole jobs: every row therefore gets a deterministic
``message_id`` (``relay.identity``: typed, length-prefixed, independent of partitioning, core
count, shuffle order, the session's time zone and the Spark version), unique in the outbox,
and a write inserts only the ids the outbox does not have yet. What identifies a row:

- ``key``: the columns that identify a message (for example ``["order_id", "event"]``);
  the id hashes their values, whatever else changes. Works for batch and streams.
- ``run_id`` (batch, no ``key``): a name for this logical run, such as the job name and the
  date it processes. The id hashes the run id, the row's full content and its occurrence
  number among identical rows (rows equal in every column are numbered 0, 1, ... by a
  window over all columns: which copy gets which number does not matter, they are equal),
  so a re-run over the same rows adds nothing, however they are partitioned.
- streams without ``key``: the query's id (kept in its checkpoint), the micro-batch id, the
  partition, the row's content and its occurrence number within the partition. A replayed
  batch reads the same offsets into the same partitions (rate, file and Kafka sources do),
  so it writes the same ids; if the stream shuffles before the sink, pass ``key``.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from relay.spark.source import OutboxDataSource
    from relay.spark.write import WriteResult, register, write_outbox

__all__ = ["LOCAL_MODE_ENV", "OutboxDataSource", "WriteResult", "register", "write_outbox"]

# Local-mode Spark on loopback, with no host name to resolve: a minimal machine or container
# may have no /etc/hosts, and then neither the machine's name nor "localhost" resolves.
# SPARK_LOCAL_IP/HOSTNAME keep the JVM on 127.0.0.1 (UnknownHostException at start-up
# otherwise); PYSPARK_UDS_MODE puts PySpark's accumulator server, which would bind
# ("localhost", 0) from Python, on a Unix-domain socket instead. PYSPARK_PYTHON: the Python
# workers run the data source and need this Python's packages (Spark's default is python3).
LOCAL_MODE_ENV = {
    "SPARK_LOCAL_IP": "127.0.0.1",
    "SPARK_LOCAL_HOSTNAME": "localhost",
    "PYSPARK_UDS_MODE": "true",
    "PYSPARK_PYTHON": sys.executable,
}

# Spark's Python workers import this package for every write, to unpickle the data source:
# the driver's API (and what it imports) loads when first used, not in every worker.
_LAZY = {
    "OutboxDataSource": "relay.spark.source",
    "WriteResult": "relay.spark.write",
    "register": "relay.spark.write",
    "write_outbox": "relay.spark.write",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
