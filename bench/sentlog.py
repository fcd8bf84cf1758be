"""Benchmark: the sent log's purge and ``relay status`` over several retention periods.

    .venv/bin/python -m bench.sentlog [--entries 10000] [--purges 30] [--cycles 3] [--rounds 3]

Starts a private PostgreSQL and, for each index on the log's sent time (the BRIN index of
migrations 0004-0007, and the B-tree of 0008), a database of its own, and plays the relay's
retention on it, one step a second (a purge interval): ``--entries`` entries are logged, as
acks log them (sent now), then the relay's purge (``OutboxAdmin.purge``) deletes the entries logged
``--purges`` steps before (the retention is ``--purges`` purge intervals), a VACUUM follows
(as autovacuum would, with an ANALYZE: the freed pages take the next entries), and ``relay status``
(``OutboxAdmin.status``) runs. So the log holds ``--purges`` steps' entries, each purge
deletes the oldest step's, and ``relay status``'s recent messages (``RECENT_SENT_S``) are the
last ten steps'. After one retention period of filling, ``--cycles`` retention periods are
measured: each step's purge and status seconds, their medians per period, how the last
period's compare with the first's, and the pages (buffers) the status's recent count and
the purge's search read at the end of each period (EXPLAIN). Each round measures both
indexes in turn; the figures are medians over ``--rounds``; the last line is one JSON object.
By hand only: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from devtools.servers import PostgresServer
from relay.constants import PURGE_CHUNK, RECENT_SENT_S
from relay.db.engine import create_engine
from relay.db.migrate import migrate
from relay.db.outbox import OutboxAdmin

INDEXES = {
    "brin (0004-0007)": "CREATE INDEX outbox_sent_time_idx ON outbox_sent USING brin (sent_at)",
    "btree (0008)": "CREATE INDEX outbox_sent_time_idx ON outbox_sent (sent_at)",
}
# Steps are this far apart (a step shorter than this waits): ``relay status`` counts the
# messages of its last ``RECENT_SENT_S`` by the database's clock, so the log's times must be
# real ones; and the purge's cut-off, computed when it runs, falls between two steps' entries.
STEP_S = 1.0
# The status's count of recent messages and the purge's search for a chunk, as
# ``OutboxAdmin`` runs them: the pages each reads.
PAGES = {
    "status_pages": "SELECT count(*) FROM outbox_sent "
    f"WHERE sent_at > now() - make_interval(secs => {RECENT_SENT_S})",
    "purge_pages": f"SELECT key FROM outbox_sent WHERE sent_at < :cutoff LIMIT {PURGE_CHUNK}",
}
LOG = """
INSERT INTO outbox_sent (key, id, created_at, sent_at)
SELECT md5(:run || n)::uuid, n, now(), now()
FROM generate_series(CAST(:first AS bigint), CAST(:last AS bigint)) AS n
RETURNING now()
"""


def one_run(
    pg: PostgresServer, index: str, entries: int, purges: int, cycles: int
) -> dict[str, list[float]]:
    """The steps on a fresh database with ``index``: each measured step's seconds, and the
    pages the status and the purge read at the end of each retention period."""
    name = f"sentlog_{uuid.uuid4().hex[:8]}"
    pg.create_database(name)
    url = pg.url(name)
    migrate(url)
    engine = create_engine(url).execution_options(isolation_level="AUTOCOMMIT")
    admin = OutboxAdmin(url, relay_session=True)
    with engine.connect() as conn:
        conn.execute(sa.text("ALTER TABLE outbox_sent SET (autovacuum_enabled = false)"))
        conn.execute(sa.text("DROP INDEX outbox_sent_time_idx"))
        conn.execute(sa.text(INDEXES[index]))
    logged_at: list[datetime] = []
    measured: dict[str, list[float]] = {what: [] for what in ("purge_s", "status_s", *PAGES)}
    next_step = time.monotonic()
    try:
        for step in range((cycles + 1) * purges):
            time.sleep(max(0.0, next_step - time.monotonic()))
            next_step = time.monotonic() + STEP_S
            first = step * entries + 1
            with engine.connect() as conn:
                values = {"run": name, "first": first, "last": first + entries - 1}
                logged_at.append(conn.execute(sa.text(LOG), values).scalars().all()[0])
                now = conn.execute(sa.text("SELECT now()")).scalar_one()
            if step < purges:
                continue  # filling the first retention period
            # Cut between the oldest step still kept and the one before it.
            oldest, kept = logged_at[step - purges], logged_at[step - purges + 1]
            cutoff = oldest + (kept - oldest) / 2
            started = time.perf_counter()
            purged = admin.purge((now - cutoff).total_seconds())
            measured["purge_s"].append(time.perf_counter() - started)
            assert purged == entries, f"purged {purged} of {entries}"
            with engine.connect() as conn:
                conn.execute(sa.text("VACUUM ANALYZE outbox_sent"))
            started = time.perf_counter()
            admin.status()
            measured["status_s"].append(time.perf_counter() - started)
            if (step + 1) % purges == 0:  # the end of a retention period
                next_cutoff = kept + (logged_at[step - purges + 2] - kept) / 2
                with engine.connect() as conn:
                    for what, query in PAGES.items():
                        pages = _pages_read(conn, query, next_cutoff)
                        measured[what].append(pages)
    finally:
        admin.close()
        engine.dispose()
        pg.psql(f"DROP DATABASE {name}")
    return measured


def _pages_read(conn: sa.Connection, query: str, cutoff: datetime) -> float:
    """The pages (shared buffers hit or read) ``query`` reads, by EXPLAIN ANALYZE."""
    explain = sa.text(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {query}")
    (plan,) = conn.execute(explain, {"cutoff": cutoff}).scalar_one()
    top = plan["Plan"]
    return float(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


def _period(values: list[float], period: int, purges: int, what: str) -> float:
    """The median step's seconds of a period, or the pages read at its end."""
    if what.endswith("_pages"):
        return values[period]
    return statistics.median(values[period * purges : (period + 1) * purges])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=10_000, help="entries per purge interval")
    parser.add_argument("--purges", type=int, default=30, help="purge intervals per retention")
    parser.add_argument("--cycles", type=int, default=3, help="retention periods measured")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    runs: dict[str, list[dict[str, list[float]]]] = {index: [] for index in INDEXES}
    with tempfile.TemporaryDirectory() as base:
        pg = PostgresServer(Path(base) / "pg")
        pg.start()
        try:
            for _ in range(args.rounds):
                for index in INDEXES:
                    runs[index].append(one_run(pg, index, args.entries, args.purges, args.cycles))
        finally:
            pg.stop()
    print(
        f"{args.entries:,} entries a second, {args.purges} purges per retention period "
        f"(a log of {args.entries * args.purges:,}): per period, the median step's seconds, "
        f"and the pages read at its end (medians of {args.rounds} rounds)"
    )
    periods = range(1, args.cycles + 1)
    columns = {
        "purge_s": "purge s",
        "status_s": "status s",
        "purge_pages": "purge pages",
        "status_pages": "status pages",
    }
    header = [f"{label}, period {c}" for label in columns.values() for c in periods]
    print(f"| index | {' | '.join(header)} | purge s last/first | status s last/first |")
    print("|---|" + "---:|" * (len(header) + 2))
    result: dict[str, dict[str, list[float]]] = {}
    for index, rounds in runs.items():
        figures = {
            what: [
                statistics.median(_period(r[what], c, args.purges, what) for r in rounds)
                for c in range(args.cycles)
            ]
            for what in columns
        }
        result[index] = figures
        cells = [
            f"{v:.4f}" if what.endswith("_s") else f"{v:.0f}"
            for what in columns
            for v in figures[what]
        ]
        purge, status = figures["purge_s"], figures["status_s"]
        print(
            f"| {index} | {' | '.join(cells)} | "
            f"{purge[-1] / purge[0]:.2f} | {status[-1] / status[0]:.2f} |"
        )
    summary = {
        "entries": args.entries,
        "purges": args.purges,
        "cycles": args.cycles,
        "rounds": args.rounds,
        "medians": result,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
