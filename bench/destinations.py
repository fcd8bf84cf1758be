"""Benchmark: good rows beside a broken destination, against the same rows alone.

    .venv/bin/python -m bench.destinations [--rounds 3]

Starts a private RabbitMQ node and PostgreSQL, then measures, in alternating order each
round, on a fresh database each time (devtools.destinations):
  (mixed) 6,000 rows for an exchange that does not exist interleaved with 6,000 good rows,
          through `relay run`: the good rows' rate by their sent_at, the broker connections
          the relay opened, its log lines about the destination, and the seconds from the
          exchange's declare until 1,000 more rows for it, written after it broke, are sent;
  (alone) the 6,000 good rows by themselves, through the same relay settings.
Prints the median of each and good_over_alone, the ratio of the medians, as one JSON line
last. By hand only: the machine is shared and noisy.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from devtools.destinations import alone, broken_destination
from devtools.servers import PostgresServer, RabbitNode
from relay.db.migrate import migrate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    mixed: list[dict[str, float]] = []
    rates: list[float] = []
    with tempfile.TemporaryDirectory(prefix="relay-destinations-") as tmp:
        base = Path(tmp)
        node = RabbitNode(base / "rabbit", name="relay-destinations")
        pg = PostgresServer(base / "pg")
        node.start()
        pg.start()
        try:
            for n in range(args.rounds):

                def database(name: str, n: int = n) -> str:
                    pg.psql(f"CREATE DATABASE {name}{n}")
                    migrate(pg.url(f"{name}{n}"))
                    return pg.url(f"{name}{n}")

                for case in ("mixed", "alone") if n % 2 == 0 else ("alone", "mixed"):
                    work = base / f"{case}{n}"
                    work.mkdir()
                    if case == "mixed":
                        report = broken_destination(work, node.url, database(case))
                        mixed.append(report.figures())
                    else:
                        rates.append(alone(work, node.url, database(case)))
                    print(case, mixed[-1] if case == "mixed" else round(rates[-1]), flush=True)
        finally:
            node.stop()
            pg.stop()
    medians = {key: statistics.median(m[key] for m in mixed) for key in mixed[0]}
    medians["alone_rows_per_s"] = round(statistics.median(rates))
    medians["good_over_alone"] = round(medians["good_rows_per_s"] / medians["alone_rows_per_s"], 2)
    print(json.dumps({"rounds": args.rounds, **medians}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
