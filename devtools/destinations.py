"""A broken destination beside a good one, through `relay run`: the scenario of the single-node
test (tests/e2e/test_destinations.py), the cluster test (tests/cluster/test_rabbitmq_cluster.py) and
bench/destinations.py.

Rows for an exchange that does not exist are written interleaved with rows for a good one
(a writer deployed before the topology had its new exchange). The relay must send the good
rows at full speed, park the bad ones after their attempts with the broker's 404 reason,
open no connection beyond its first, and say so in a few log lines; once the exchange is
declared, the bad rows still pending must go out within seconds.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import sqlalchemy as sa

from devtools.broker import declare_bound, drain, names
from devtools.outbox import insert
from devtools.relayproc import RelayProcess, relay_on_new_queue
from devtools.scrape import http_get, metric
from devtools.servers import free_port, wait_until
from relay.db.schema import outbox

GOOD = 6000
BAD = 6000
LATE = 1000  # bad rows written after the first ones are parked, pending when it is fixed
WINDOW = 1000
SETTINGS = {
    "RELAY_WINDOW": str(WINDOW),
    # A held row's attempts (0.5 + 1 + 2 + 4 + 5 + 5 s of back-off at the least) outlast the
    # longest wait for the next passive declare (DESTINATION_PROBE_MAX_S plus its jitter),
    # so that no late row is parked between the exchange's declare and the relay finding it.
    # With 4 attempts (3.5 s) a few late rows were, and were rightly never sent.
    "RELAY_MAX_ATTEMPTS": "7",
    "RELAY_BACKOFF_INITIAL": "0.5",
    "RELAY_BACKOFF_MAX": "5",
    "RELAY_LOG_FORMAT": "json",
    # The scenario reads each row's fate and sent time by its message id: rows kept whole.
    "RELAY_KEEP_SENT": "messages",
}
# What a line about the destination says: its state, a channel or a connection lost, and the
# rows parked because of it.
DESTINATION_ACTIONS = {
    "destination_broken",
    "destination_back",
    "channel_closed",
    "broker_disconnected",
    "row_parked",
    "rows_parked",
}


@dataclass(frozen=True)
class Report:
    good_rows_per_s: float  # by the good rows' sent_at: first to last, the database's clock
    connections: int  # the relay's relay_broker_connections_total at the end
    destination_lines: list[dict[str, object]]
    parked_reasons: Counter[str]
    parked_attempts: set[int]
    good_delivered: list[str]  # message ids, as consumed
    late_delivered: int
    recovery_s: float  # from the exchange's declare to the last late row sent

    def figures(self) -> dict[str, float]:
        return {
            "good_rows_per_s": round(self.good_rows_per_s),
            "connections": self.connections,
            "destination_lines": len(self.destination_lines),
            "recovery_s": round(self.recovery_s, 2),
        }


def _sent_rate(database_url: str, prefix: str) -> float:
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        first, last, count = conn.execute(
            sa.select(
                sa.func.min(outbox.c.sent_at), sa.func.max(outbox.c.sent_at), sa.func.count()
            ).where(outbox.c.message_id.startswith(prefix), outbox.c.status == "sent")
        ).one()
    engine.dispose()
    assert isinstance(first, datetime) and isinstance(last, datetime)
    return float(count) / max((last - first).total_seconds(), 1e-3)


def _count(database_url: str, prefix: str, **where: object) -> int:
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        query = sa.select(sa.func.count()).where(outbox.c.message_id.startswith(prefix))
        for column, value in where.items():
            query = query.where(outbox.c[column] == value)
        count = int(conn.execute(query).scalar_one())
    engine.dispose()
    return count


def _rows(prefix: str, exchange: str, count: int) -> list[dict[str, object]]:
    return [
        {"message_id": f"{prefix}{i}", "exchange": exchange, "routing_key": "k", "payload": b"x"}
        for i in range(count)
    ]


def alone(tmp: Path, amqp_url: str, database_url: str) -> float:
    """The good rows' rate without the bad rows: GOOD rows through the same relay settings."""
    _exchange, queue, env = relay_on_new_queue(tmp, "alone", database_url, amqp_url, **SETTINGS)
    insert(database_url, _rows("alone-", _exchange, GOOD))
    with RelayProcess(env, tmp / "alone.log") as proc:
        wait_until(lambda: _count(database_url, "alone-", status="sent") == GOOD, 120, "sent")
        assert proc.stop() == 0
    assert len(drain(amqp_url.split(",", maxsplit=1)[0], queue, expect=GOOD, timeout=60)) >= GOOD
    return _sent_rate(database_url, "alone-")


def broken_destination(tmp: Path, amqp_url: str, database_url: str) -> Report:
    """The scenario (module docstring); ``amqp_url``: one node's URL or a comma list."""
    admin_url = amqp_url.split(",", maxsplit=1)[0]
    port = free_port()
    exchange, queue, env = relay_on_new_queue(
        tmp, "good", database_url, amqp_url, RELAY_METRICS_PORT=str(port), **SETTINGS
    )
    missing, late_queue = names("missing")
    good, bad = _rows("good-", exchange, GOOD), _rows("bad-", missing, BAD)
    insert(database_url, [row for pair in zip(good, bad, strict=True) for row in pair])
    log_path = tmp / "relay.log"
    with RelayProcess(env, log_path) as proc:
        wait_until(
            lambda: (
                _count(database_url, "good-", status="sent") == GOOD
                and _count(database_url, "bad-", status="parked") == BAD
            ),
            120,
            "good rows sent and bad rows parked",
        )
        insert(database_url, _rows("late-", missing, LATE))
        wait_until(
            lambda: _count(database_url, "late-", attempts=0) == 0,
            60,
            "every late row charged an attempt",
        )
        declare_bound(admin_url, missing, late_queue)
        declared = time.monotonic()
        wait_until(lambda: _count(database_url, "late-", status="sent") == LATE, 60, "late rows")
        recovery = time.monotonic() - declared
        connections = metric(
            http_get(f"http://127.0.0.1:{port}/metrics")[1], "relay_broker_connections_total"
        )
        assert proc.stop() == 0
        assert proc.tracebacks() == []
    engine = sa.create_engine(database_url)
    with engine.connect() as conn:
        parked = conn.execute(
            sa.select(outbox.c.last_error, outbox.c.attempts).where(
                outbox.c.message_id.startswith("bad-")
            )
        ).all()
    engine.dispose()
    lines = [json.loads(x) for x in log_path.read_text().splitlines() if x.startswith("{")]
    return Report(
        good_rows_per_s=_sent_rate(database_url, "good-"),
        connections=int(connections),
        destination_lines=[x for x in lines if x["action"] in DESTINATION_ACTIONS],
        parked_reasons=Counter(str(p.last_error) for p in parked),
        parked_attempts={int(p.attempts) for p in parked},
        good_delivered=[d.message_id for d in drain(admin_url, queue, expect=GOOD, timeout=60)],
        late_delivered=len({d.message_id for d in drain(admin_url, late_queue, LATE, 60)}),
        recovery_s=recovery,
    )
