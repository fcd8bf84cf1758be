"""A live stream is relayed by every relay, not one: two or three `relay run` processes on one
PostgreSQL outbox, their buckets shared out, then a writer adds 3,000 rows at a steady 300
rows/s (paced; a loaded machine stretches the stream rather than writing fewer rows); each
relay publishes between 0.8 and 1.2 of its fair part of them.

With runs of 1,024 consecutive ids dealt to consecutive buckets, and relays owning contiguous
ranges of buckets, one relay published the whole stream while the others idled
(``relay.buckets``: runs of ``BUCKET_SPAN_ROWS`` ids, ``BUCKET_STRIDE`` buckets apart)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from devtools.outbox import insert, statuses
from devtools.relayproc import RelayProcess, relay_on_new_queue, wait_sharing
from devtools.scrape import http_get, metric
from devtools.servers import RabbitNode, free_port, wait_until
from relay.records import SENT

pytestmark = pytest.mark.databases("postgresql")
RATE = 300  # rows/s
# As many rows whatever the machine's speed: the share's bounds are judged on runs of
# consecutive ids, and fewer rows (a fixed window on a loaded machine) are too few runs.
ROWS = 3000
TICK_S = 0.1  # the writer commits RATE * TICK_S rows every TICK_S


def published(port: int) -> float:
    return metric(http_get(f"http://127.0.0.1:{port}/metrics")[1], "relay_published_total")


def stream(url: str, exchange: str) -> int:
    """ROWS rows at RATE a second at most, paced by the clock; how many."""
    per_tick, written, started = int(RATE * TICK_S), 0, time.monotonic()
    while written < ROWS:
        rows = [
            {"message_id": f"s-{written + n}", "exchange": exchange, "payload": b"p"}
            for n in range(per_tick)
        ]
        insert(url, rows)
        written += per_tick
        time.sleep(max(0.0, written / RATE - (time.monotonic() - started)))
    return written


@pytest.mark.parametrize("relays", [2, 3])
def test_each_relay_publishes_its_part_of_a_live_stream(
    relays: int, tmp_path: Path, rabbit: RabbitNode, database_url: str
) -> None:
    exchange, _queue, env = relay_on_new_queue(
        tmp_path, "share", database_url, rabbit.url, RELAY_METRICS_HOST="127.0.0.1"
    )
    ports = [free_port() for _ in range(relays)]
    processes = [
        RelayProcess(
            {**env, "RELAY_METRICS_PORT": str(port), "RELAY_NAME": f"share-{n}"},
            tmp_path / f"share-{n}.log",
        )
        for n, port in enumerate(ports)
    ]
    try:
        for process in processes:
            process.start()
        wait_sharing(database_url, ports)
        before = [published(port) for port in ports]
        written = stream(database_url, exchange)
        wait_until(lambda: statuses(database_url).get(SENT, 0) == written, 60, "the rows sent")
        parts = [(published(port) - b) / written for port, b in zip(ports, before, strict=True)]
    finally:
        for process in processes:
            process.stop()
    print(f"{relays} relays, {written} rows: parts {parts}")
    assert sum(parts) == pytest.approx(1.0, abs=0.02)  # a few rows published twice at most
    assert all(0.8 / relays <= part <= 1.2 / relays for part in parts), parts
