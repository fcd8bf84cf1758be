"""A standalone Spark cluster on loopback: a master and two workers, each a JVM of its own.

The workers listen on 127.0.0.1 and 127.0.0.2, so Spark takes them for two hosts (it never
runs a speculative copy of a task on the host of the attempt it copies). Each worker is
started in a process group of its own: its executor and the executor's Python workers are
its children, and ``kill_worker`` takes them all at once, as losing the machine would.
The JVMs are PySpark's own (``bin/spark-class`` of the installed package), on the machine's
Java; every host is an address, so nothing needs a host name to resolve.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import urllib.request
from pathlib import Path

import pyspark

from devtools.servers import ServerError, free_port, wait_until

HOSTS = ("127.0.0.1", "127.0.0.2")
WORKER_CORES = 1
WORKER_MEMORY = "1g"
START_TIMEOUT_S = 120.0


class SparkCluster:
    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.ui_port = free_port()
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        return f"spark://{HOSTS[0]}:{self.port}"

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self._master = self._jvm(
            "master",
            HOSTS[0],
            "org.apache.spark.deploy.master.Master",
            *("--host", HOSTS[0], "--port", str(self.port), "--webui-port", str(self.ui_port)),
        )
        for n, host in enumerate(HOSTS):
            work = self.base / f"worker-{n}"
            work.mkdir(exist_ok=True)
            self._workers.append(
                self._jvm(
                    f"worker-{n}",
                    host,
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", host, "--webui-port", str(free_port())),
                    *("--cores", str(WORKER_CORES), "--memory", WORKER_MEMORY),
                    *("--work-dir", str(work), self.master_url),
                )
            )
        wait_until(lambda: self.alive_workers() == len(HOSTS), START_TIMEOUT_S, "the Spark workers")

    def _jvm(self, name: str, host: str, main_class: str, *args: str) -> subprocess.Popen[bytes]:
        spark_home = Path(pyspark.__file__).parent
        env = {
            **os.environ,
            "SPARK_HOME": str(spark_home),
            "SPARK_LOCAL_IP": host,
            "SPARK_LOCAL_HOSTNAME": host,
            "SPARK_LOG_DIR": str(self.base),
        }
        with (self.base / f"{name}.log").open("wb") as log:
            return subprocess.Popen(
                [str(spark_home / "bin" / "spark-class"), main_class, *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def alive_workers(self) -> int:
        if self._master is not None and self._master.poll() is not None:
            raise ServerError(f"the Spark master exited: see {self.base / 'master.log'}")
        try:
            with urllib.request.urlopen(f"http://{HOSTS[0]}:{self.ui_port}/json/", timeout=2) as r:
                return int(json.load(r)["aliveworkers"])
        except (OSError, ValueError):
            # ValueError: while the master's UI starts, its HTML page is attached before its
            # JSON twin, and for that moment /json/ answers with the page (seen in CI).
            return 0

    def kill_worker(self, n: int) -> None:
        """SIGKILL worker ``n``, its executors and their Python workers at once."""
        os.killpg(self._workers[n].pid, signal.SIGKILL)
        self._workers[n].wait()

    def stop(self) -> None:
        for proc in [*self._workers, *([self._master] if self._master else [])]:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def logs(self) -> str:
        """The end of every JVM's log, for a failing test's message."""
        return "\n".join(
            f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}"
            for path in sorted(self.base.glob("*.log"))
        )
