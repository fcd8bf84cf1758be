"""A Spark Connect server on loopback, for clients made with ``SparkSession.builder.remote``.

The server is PySpark's own (``bin/spark-submit`` of the installed package, whose jars
include Spark Connect's), a JVM in local mode on the machine's Java, listening on
127.0.0.1 only. It runs in a process group of its own: its Python workers, which run the
outbox data source's planner, tasks and commit, are its children and stop with it. Its log
is kept in ``base`` for a failing test to show.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pyspark

from devtools.servers import ServerError, free_port, port_open, wait_until
from relay.spark import LOCAL_MODE_ENV

HOST = "127.0.0.1"
MAIN_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
# A hang guard on the start, not a window: the JVM starts and opens its gRPC port in about
# 20 s on two idle cores, and several times that beside other JVMs.
START_TIMEOUT_S = 180.0
# How long a SIGTERM'd server may take to stop before it is killed.
STOP_TIMEOUT_S = 30.0
# Each task may fail three times (the tests' classic session's local[2,4]): a retried task
# must not write its rows twice.
MASTER = "local[2,4]"
LOG_TAIL_CHARS = 4000


class SparkConnectServer:
    """``python_path``: directories put before the inherited PYTHONPATH of the server's
    Python workers, where the outbox data source must be importable (a checkout of this
    project, say; an installed ``outbox-relay[spark]`` needs none). ``python``: the Python
    they run (PYSPARK_PYTHON), this one by default."""

    def __init__(
        self, base: Path, python_path: Sequence[Path] = (), python: str = sys.executable
    ) -> None:
        self.base = base
        self.python_path = python_path
        self.python = python
        self.port = free_port()
        self.log_path = base / "spark-connect.log"
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"sc://{HOST}:{self.port}"

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        spark_home = Path(pyspark.__file__).parent
        inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
        env = {
            **os.environ,
            **LOCAL_MODE_ENV,
            "SPARK_HOME": str(spark_home),
            "SPARK_LOG_DIR": str(self.base),
            # Spark's Python workers add PySpark's own paths to this one.
            "PYTHONPATH": os.pathsep.join([*map(str, self.python_path), *inherited]),
            "PYSPARK_PYTHON": self.python,
        }
        conf = {
            "spark.connect.grpc.binding.address": HOST,
            "spark.connect.grpc.binding.port": str(self.port),
            "spark.ui.enabled": "false",
            "spark.sql.shuffle.partitions": "4",
        }
        command = [
            str(spark_home / "bin" / "spark-submit"),
            *("--master", MASTER, "--class", MAIN_CLASS),
            *(arg for name, value in conf.items() for arg in ("--conf", f"{name}={value}")),
        ]
        with self.log_path.open("wb") as log:
            # cwd: spark-submit's spark-warehouse and Derby files go into base too.
            self._proc = subprocess.Popen(
                command,
                cwd=self.base,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            wait_until(self._listening, START_TIMEOUT_S, f"the Spark Connect server on {self.url}")
        except ServerError as exc:
            self.stop()
            tail = self.log_tail()
            raise ServerError(f"{exc}; its log ({self.log_path}) ends:\n{tail}") from None

    def _listening(self) -> bool:
        if self._proc is not None and self._proc.poll() is not None:
            raise ServerError(f"the Spark Connect server exited with {self._proc.returncode}")
        return port_open(HOST, self.port)

    def stop(self) -> None:
        """SIGTERM the server's process group (the JVM and its Python workers), SIGKILL it if
        it has not stopped in STOP_TIMEOUT_S."""
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_tail(self, since: int = 0) -> str:
        """The end of the server's log, from byte ``since`` on (what one test added)."""
        with self.log_path.open("rb") as log:
            log.seek(since)
            return log.read().decode(errors="replace")[-LOG_TAIL_CHARS:]
