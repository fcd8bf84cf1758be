"""Benchmark: how long a crash keeps the relays from claiming, at a sent log's size.

    .venv/bin/python -m bench.sentlog_rebuild --pg-data DIR [--database soak_aged]
                                              [--relays 1] [--setting shared_buffers=2GB ...]

On PostgreSQL the sent log is unlogged and rebuilt from its journal after a crash or a
failover (``relay.db.sentlog``); relays claim nothing until it is whole. This starts the kept
cluster of a soak (``bench.soak --pg-data DIR --sent-log-entries N``), crashes it (an
immediate stop: no shutdown checkpoint, so recovery empties the unlogged tables), starts it
again, checks the log came back empty, and rebuilds it as the relays do (``--relays``
trying at once, one rebuilding while the others look again until it is complete): the
seconds, the entries a second, and the CPU and WAL that cost. The last line is one JSON
object. By hand only: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from pathlib import Path

import psycopg

from devtools.procfs import tree_cpu_seconds
from devtools.servers import PostgresServer
from relay.constants import SENT_LOG_CHECK_S
from relay.db.sentlog import SentLogRebuild


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pg-data", type=Path, required=True)
    parser.add_argument("--database", default="soak_aged")
    parser.add_argument("--relays", type=int, default=1)
    parser.add_argument(
        "--setting", action="append", default=[], metavar="NAME=VALUE", help="a server setting"
    )
    args = parser.parse_args()
    pg = PostgresServer(args.pg_data, settings=args.setting)
    pg.start()
    try:
        dsn = f"host=127.0.0.1 port={pg.port} user=postgres dbname={args.database}"
        with psycopg.connect(dsn, autocommit=True) as conn:
            journaled = conn.execute(
                "SELECT coalesce(sum(cardinality(message_keys)), 0) FROM outbox_sent_journal"
            ).fetchone()[0]  # type: ignore[index]
        print(f"{journaled} entries journaled; crashing the server", flush=True)
        pg.stop("immediate")
        pg.start()
        with psycopg.connect(dsn, autocommit=True) as conn:
            left = conn.execute("SELECT count(*) FROM outbox_sent_log").fetchone()[0]  # type: ignore[index]
            assert left == 0, f"the unlogged log kept {left} entries through the crash"
            lsn = "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')"
            wal0 = conn.execute(lsn).fetchone()[0]  # type: ignore[index]
            cpu0 = tree_cpu_seconds(pg.pid())
            started = time.monotonic()
            copied = [0] * args.relays

            def rebuild(i: int) -> None:
                rebuilder = SentLogRebuild(pg.url(args.database))
                try:
                    while not rebuilder.complete():
                        if (entries := rebuilder.rebuild()) is None:
                            time.sleep(SENT_LOG_CHECK_S)
                        else:
                            copied[i] += entries
                finally:
                    rebuilder.close()

            threads = [threading.Thread(target=rebuild, args=(i,)) for i in range(args.relays)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            seconds = time.monotonic() - started
            cpu = tree_cpu_seconds(pg.pid()) - cpu0
            wal = conn.execute(lsn).fetchone()[0] - wal0  # type: ignore[index]
            logged = conn.execute("SELECT count(*) FROM outbox_sent_log").fetchone()[0]  # type: ignore[index]
        result = {
            "journaled": int(journaled),
            "rebuilt": int(logged),
            "copied": sum(copied),
            "seconds": round(seconds, 1),
            "entries_per_s": round(sum(copied) / seconds),
            "db_cpu_s": round(cpu, 1),
            "wal_mb": round(float(wal) / 2**20, 1),
            "relays": args.relays,
            "settings": args.setting,
        }
        print(json.dumps(result), flush=True)
    finally:
        pg.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
