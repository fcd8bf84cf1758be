"""Benchmark: how long a crash of PostgreSQL pauses delivery, at a sent log's age; and how
long the upgrade's migration takes beside a sent log of the release before.

    .venv/bin/python -m bench.failover [--entries 12000000 --entries 60000000] [--rate 100]
                                       [--base DIR]

For each ``--entries N``, on a private PostgreSQL and RabbitMQ:

- **the migration**: the schema at 0014 with an old sent log (``outbox_sent``) of N entries,
  `relay migrate` to this release's: its seconds (the relays of the release before publish
  on meanwhile: nothing it does waits on them or holds them up).
- **the upkeep** (once, at ``--upkeep-entries``): a day of acks sealed an hour at a time,
  merged four by four up to the top level, as the relays' upkeep does over a day: the WAL
  the runs wrote per entry, beside the journal's (compare the writer's INSERT, about 640 B
  a row at 200-byte payloads, ``bench.soak``).
- **the crash**: this release's sent log aged by SQL to N entries over six days, sealed into
  runs as the relays' upkeep does (its seconds, its steps, and the longest step: a seal's
  transaction and a merge's at most) up to just before their next seal is due, its last 15
  minutes left unsealed and as dense as ``--tail-rate`` acks a second make them (the most a
  crash copies back before claims go on), a relay publishing a writer's ``--rate`` rows a
  second; PostgreSQL stopped ``-m immediate`` and started. The pause: from the
  server accepting connections again to the delivery of a row written then; and how long
  the whole journal took to be copied back (claims go on meanwhile).

A JSON line of the pause as soon as it is measured, one per size once the whole log is back,
then a summary line starting ``# FAILOVER ``. The aged log is journaled only (not copied
into the log beforehand: the crash empties it). By hand only: the
machine is shared and noisy; a size of 60 million entries needs about 15 GB of disk and
half an hour here.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import sqlalchemy as sa

from devtools.broker import simple_topology, write_topology
from devtools.outbox import age_sent_log, fates, insert
from devtools.relayproc import RELAY, RelayProcess, relay_env
from devtools.servers import PostgresServer, RabbitNode, free_port, wait_until
from relay.constants import SENT_RUN_MARGIN_S, SENT_RUN_SEAL_S
from relay.db.migrate import migrate
from relay.db.sentlog import SentLogRebuild
from relay.db.sentruns import SEAL_LOCK, SentRuns

EXCHANGE, QUEUE = "bench.failover", "bench.failover.all"
# The journal's tail a crash finds unsealed at worst: a seal is due once the tail reaches
# back the margin and the seal interval, and leaves the margin unsealed.
TAIL_S = SENT_RUN_MARGIN_S + SENT_RUN_SEAL_S


def migration_seconds(pg: PostgresServer, entries: int) -> float:
    """`relay migrate` from 0014 to this release's, beside an old sent log of ``entries``."""
    pg.create_database("migrate")
    url = pg.url("migrate")
    migrate(url, "0014")
    engine = sa.create_engine(url)
    old_log = sa.text(
        "INSERT INTO outbox_sent (key, id, created_at, sent_at) "
        "SELECT CAST(md5('old-' || n) AS uuid), n, now() - interval '7 days', "
        "now() - make_interval(secs => 518400.0 * (1 - n / CAST(:n AS float))) "
        "FROM generate_series(1, :n) n"
    )
    with engine.begin() as conn:
        conn.execute(old_log, {"n": entries})
    engine.dispose()
    began = time.monotonic()
    done = subprocess.run(
        [*RELAY, "migrate"], env=relay_env(RELAY_DATABASE_URL=url), capture_output=True, check=False
    )
    took = time.monotonic() - began
    if done.returncode != 0:
        raise SystemExit(f"relay migrate failed: {done.stderr.decode()}")
    return took


def upkeep_wal(pg: PostgresServer, entries: int) -> dict[str, float]:
    """WAL bytes per entry: of the journal and log as ``age_sent_log`` writes them, and of
    the runs sealed from them an hour at a time and merged, up to the top level."""
    pg.create_database("upkeep")
    url = pg.url("upkeep")
    migrate(url)
    engine = sa.create_engine(url)
    lsn = sa.text("SELECT pg_current_wal_insert_lsn() - CAST('0/0' AS pg_lsn)")

    def wal() -> float:
        with engine.connect() as conn:
            return float(conn.execute(lsn).scalar_one())

    try:
        first = wal()
        age_sent_log(url, entries, days=1.0)
        aged = wal()
        for hours in range(23, 0, -1):  # an hour later each time
            keeper = SentRuns(url, settle_s=0.0, seal_s=3600, margin_s=hours * 3600, fanin=4)
            try:
                keeper.maintain()
            finally:
                keeper.close()
        sealed = wal()
    finally:
        engine.dispose()
    return {
        "journal_wal_b_per_entry": round((aged - first) / entries, 1),
        "runs_wal_b_per_entry": round((sealed - aged) / entries, 1),
    }


class Writer:
    """``rate`` rows a second, each in a transaction of its own, until stopped."""

    def __init__(self, url: str, rate: float) -> None:
        self.engine = sa.create_engine(url, pool_pre_ping=True)
        self.rate = rate
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._write, daemon=True)

    def _write(self) -> None:
        n = 0
        while not self.stopped.wait(1 / self.rate):
            row = {"message_id": f"live-{n}", "exchange": EXCHANGE, "payload": b"x"}
            # The database is down: the row is never written, and the writer goes on.
            with contextlib.suppress(sa.exc.SQLAlchemyError):
                insert(self.engine, [row])
            n += 1

    def __enter__(self) -> Writer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=10)
        self.engine.dispose()


def _tail_entries(url: str) -> int:
    """The journal's entries no run holds: what a crash now copies back first."""
    engine = sa.create_engine(url, poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text(
                        "SELECT coalesce(sum(cardinality(message_keys)), 0) "
                        "FROM outbox_sent_journal "
                        "WHERE sent_at >= (SELECT max(upto) FROM outbox_sent_runs)"
                    )
                ).scalar_one()
            )
    finally:
        engine.dispose()


def crash(
    pg: PostgresServer,
    rabbit: RabbitNode,
    base: Path,
    entries: int,
    rates: tuple[float, float],
) -> dict[str, float]:
    rate, tail_rate = rates
    pg.create_database("crash")
    url = pg.url("crash")
    migrate(url)
    began = time.monotonic()
    # The journal only: the crash empties the log, and no id of the writer's is one of these.
    age_sent_log(url, entries, logged=False)
    aged = time.monotonic() - began
    # Sealed as the relays leave it just before their next seal is due: the journal's last
    # margin and seal interval unsealed, the most a crash copies back before claims go on.
    keeper = SentRuns(url, settle_s=0.0, margin_s=TAIL_S)
    steps: list[float] = []
    try:
        while True:  # as the relays' upkeep takes them: each step a transaction
            began = time.monotonic()
            more = keeper.step().more
            steps.append(time.monotonic() - began)
            if not more:
                break
    finally:
        keeper.close()
    # That tail as ``tail_rate`` acks a second would have left it (a relay's seal held off
    # until the crash, so that the crash finds it whole).
    age_sent_log(url, round(tail_rate * TAIL_S), days=TAIL_S / 86400, first=entries, logged=False)
    tail = _tail_entries(url)
    topology = write_topology(base / "topology.toml", simple_topology(EXCHANGE, QUEUE))
    env = relay_env(
        RELAY_DATABASE_URL=url,
        RELAY_AMQP_URL=rabbit.url,
        RELAY_TOPOLOGY_FILE=str(topology),
        RELAY_METRICS_PORT=str(free_port()),
        RELAY_METRICS_HOST="127.0.0.1",
    )
    sealer = sa.create_engine(url, poolclass=sa.NullPool)
    holder = sealer.connect()
    holder.execute(sa.select(sa.func.pg_advisory_lock(SEAL_LOCK)))
    with RelayProcess(env, base / f"relay-{entries}.log"), Writer(url, rate):
        insert(url, [{"message_id": "before", "exchange": EXCHANGE, "payload": b"x"}])
        wait_until(lambda: fates(url, ["before"]) == {"before": "sent"}, 120, "relaying")
        pg.psql("CHECKPOINT")
        pg.stop("immediate")
        with contextlib.suppress(sa.exc.DBAPIError):
            holder.close()
        sealer.dispose()
        pg.start()
        accepting = time.monotonic()
        insert(url, [{"message_id": "after", "exchange": EXCHANGE, "payload": b"x"}])
        wait_until(lambda: fates(url, ["after"]) == {"after": "sent"}, 3600, "delivered")
        pause = time.monotonic() - accepting
        print(json.dumps({"entries": entries, "pause_s": round(pause, 2)}), flush=True)
        rebuild = SentLogRebuild(url)
        try:
            wait_until(rebuild.complete, 7200, "the whole journal copied back")
        finally:
            rebuild.close()
        whole = time.monotonic() - accepting
    return {
        "aged_s": round(aged, 1),
        "sealed_s": round(sum(steps), 1),
        "upkeep_steps": len(steps),
        "longest_step_s": round(max(steps), 2),
        "tail_entries": tail,
        "pause_s": round(pause, 2),
        "whole_log_back_s": round(whole, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, action="append")
    parser.add_argument("--rate", type=float, default=100.0, help="rows a second written")
    parser.add_argument(
        "--tail-rate",
        type=float,
        default=2000.0,
        help="acks a second the journal's unsealed tail holds at the crash",
    )
    parser.add_argument("--base", type=Path, help="where the servers live (a temporary directory)")
    parser.add_argument("--upkeep-entries", type=int, default=500_000)
    parser.add_argument(
        "--no-migration", action="store_true", help="leave out the migration's time"
    )
    args = parser.parse_args()
    sizes = args.entries or [12_000_000, 60_000_000]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-failover-", dir=args.base) as tmp:
        base = Path(tmp)
        pg = PostgresServer(base / "pg-upkeep")
        pg.start()
        try:
            upkeep = upkeep_wal(pg, args.upkeep_entries)
        finally:
            pg.stop("immediate")
        print(json.dumps(upkeep), flush=True)
        rabbit = RabbitNode(base / "rabbit", name="relay-bench-failover")
        rabbit.start()
        try:
            for entries in sizes:
                pg = PostgresServer(base / f"pg-{entries}")
                pg.start()
                try:
                    result: dict[str, float] = {"entries": entries}
                    if not args.no_migration:
                        result["migration_s"] = round(migration_seconds(pg, entries), 2)
                    result |= crash(pg, rabbit, base, entries, (args.rate, args.tail_rate))
                finally:
                    pg.stop("immediate")
                print(json.dumps(result), flush=True)
                results.append(result)
        finally:
            rabbit.stop()
    summary = {"rate": args.rate, "tail_rate": args.tail_rate, **upkeep, "sizes": results}
    print("# FAILOVER " + json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
