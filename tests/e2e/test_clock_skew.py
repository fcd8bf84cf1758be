"""Relays whose host clocks are wrong (libfaketime on the relay process only, the monotonic
clock untouched, as a drifted NTP leaves it): leases, due times and back-off are the
database's, so a skewed relay neither steals another's buckets, nor holds rows back, nor
retries early.

Rows are written with plain SQL and the column defaults, as any writer does; a consumer
counts what reached the queue."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import sqlalchemy as sa

from devtools.broker import drain
from devtools.outbox import insert, statuses
from devtools.relayproc import (
    RelayProcess,
    relay_on_new_queue,
    skew_unavailable,
    skewed,
    wait_sharing,
)
from devtools.scrape import http_get, metric
from devtools.servers import RabbitNode, free_port, wait_until
from relay.db.clock import database_time, seconds_between
from relay.db.schema import outbox

# The database's clock and the relay's, whichever database: MariaDB's as much as PostgreSQL's.
pytestmark = pytest.mark.databases("postgresql", "mariadb")

TEN_MINUTES_AHEAD, TEN_MINUTES_BEHIND = "+10m", "-10m"
SKEW_S = 600.0
ROWS_PER_WRITER = 3000


@pytest.fixture(scope="module")
def faketime() -> None:
    # Never skipped: `scripts/bootstrap test` installs Debian's faketime, and a suite that
    # skipped these would pass without ever skewing a clock.
    reason = skew_unavailable()
    if reason is not None:
        pytest.fail(f"cannot skew a relay's clock here: {reason}", pytrace=False)


@dataclass(frozen=True)
class Setup:
    database_url: str
    amqp_url: str
    exchange: str  # a topic exchange bound to ``queue`` for every routing key
    queue: str
    env: dict[str, str]  # a relay's, on that topology and outbox


@pytest.fixture
def setup(faketime: None, tmp_path: Path, rabbit: RabbitNode, database_url: str) -> Setup:
    """What each test here needs (``faketime`` fails where a relay's clock cannot be skewed)."""
    exchange, queue, env = relay_on_new_queue(
        tmp_path,
        "skew",
        database_url,
        rabbit.url,
        RELAY_METRICS_HOST="127.0.0.1",
        RELAY_LOG_FORMAT="json",
    )
    return Setup(database_url, rabbit.url, exchange, queue, env)


def write(url: str, first: int, count: int, exchange: str, routing_key: str = "k") -> None:
    """``count`` rows in statements of 50, as an application writes them (column defaults),
    over a second or two: the relays claim while rows arrive."""
    for start in range(first, first + count, 50):
        insert(
            url,
            [
                {
                    "message_id": f"m-{i}",
                    "exchange": exchange,
                    "routing_key": routing_key,
                    "payload": b"p%d" % i,
                }
                for i in range(start, min(start + 50, first + count))
            ],
        )
        time.sleep(0.02)


def test_two_relays_ten_minutes_apart_publish_every_row_once(
    tmp_path: Path,
    setup: Setup,
) -> None:
    """The relay ahead judges every lease by the database's clock, not its own: before,
    it took each of the other relay's leases for expired and published those rows again
    (2,994 duplicates of 6,000 rows). The rows lie in buckets of both relays."""
    env = setup.env
    ports = [free_port(), free_port()]
    relays = [
        RelayProcess(
            {**env, "RELAY_METRICS_PORT": str(ports[0]), "RELAY_NAME": "on-time"},
            tmp_path / "on-time.log",
        ),
        RelayProcess(
            skewed(
                {**env, "RELAY_METRICS_PORT": str(ports[1]), "RELAY_NAME": "ahead"},
                TEN_MINUTES_AHEAD,
            ),
            tmp_path / "ahead.log",
        ),
    ]
    total = 2 * ROWS_PER_WRITER
    try:
        for proc in relays:
            proc.start()
        wait_sharing(setup.database_url, ports)
        writers = [
            threading.Thread(
                target=write,
                args=(setup.database_url, n * ROWS_PER_WRITER, ROWS_PER_WRITER, setup.exchange),
            )
            for n in range(2)
        ]
        started = time.monotonic()
        for w in writers:
            w.start()
        for w in writers:
            w.join()
        wait_until(lambda: statuses(setup.database_url).get("sent") == total, 120, "every row sent")
        drained_in = time.monotonic() - started
        published = [
            metric(http_get(f"http://127.0.0.1:{port}/metrics")[1], "relay_published_total")
            for port in ports
        ]
        for proc in relays:
            assert proc.stop() == 0
    finally:
        for proc in relays:
            if proc.running:
                proc.kill()
    delivered = Counter(
        d.message_id for d in drain(setup.amqp_url, setup.queue, expect=total, timeout=120)
    )
    duplicates = sum(delivered.values()) - len(delivered)
    lost = total - len(delivered)
    print(
        f"two relays 10 min apart: {total} rows, {duplicates} duplicates, {lost} lost, "
        f"published {published[0]:.0f} + {published[1]:.0f}, all sent in {drained_in:.1f} s"
    )
    assert all(n > 0 for n in published), f"one relay did all the work: {published}"
    assert (duplicates, lost) == (0, 0)
    assert set(delivered) == {f"m-{i}" for i in range(total)}
    assert not any(proc.tracebacks() for proc in relays)


def test_a_relay_ten_minutes_behind_publishes_new_rows_at_once(
    tmp_path: Path,
    setup: Setup,
) -> None:
    """Rows are due by the database's clock: before, a relay 10 minutes behind held every
    row written with the column defaults back for 10 minutes."""
    env = skewed({**setup.env, "RELAY_METRICS_PORT": "0"}, TEN_MINUTES_BEHIND)
    with RelayProcess(env, tmp_path / "behind.log") as proc:
        wait_until(lambda: "broker_connected" in proc.log(), 60, "the relay connected")
        started = time.monotonic()
        write(setup.database_url, 0, 500, setup.exchange)
        wait_until(
            lambda: statuses(setup.database_url).get("sent") == 500,
            30,
            "500 rows sent by a relay 10 minutes behind (not 10 minutes later)",
        )
        print(
            f"relay 10 min behind: 500 rows sent {time.monotonic() - started:.1f} s after "
            "the first was written"
        )
        assert proc.stop() == 0
    assert len({d.message_id for d in drain(setup.amqp_url, setup.queue, expect=500)}) == 500


@pytest.mark.parametrize("offset", [TEN_MINUTES_AHEAD, TEN_MINUTES_BEHIND])
def test_a_skewed_relay_backs_off_by_the_databases_clock(
    tmp_path: Path,
    setup: Setup,
    offset: str,
) -> None:
    """An unroutable row (returned) is retried after ``backoff_initial`` plus jitter of
    database time, whichever way the relay's clock is off: not at once (behind), not ten
    minutes late (ahead)."""
    initial = 2.0
    env = skewed(
        {
            **setup.env,
            "RELAY_METRICS_PORT": "0",
            "RELAY_BACKOFF_INITIAL": str(initial),
            "RELAY_BACKOFF_MAX": str(initial),
        },
        offset,
    )
    # The exchange exists (the topology declares it) and binds "#": an unroutable row needs
    # a routing key nothing binds, so it goes to the default exchange's queue that is not.
    insert(
        setup.database_url,
        [{"message_id": "lost", "exchange": "", "routing_key": "no.such.queue", "payload": b"p"}],
    )
    engine = sa.create_engine(setup.database_url)
    due_in = sa.select(
        outbox.c.attempts, seconds_between(database_time(), outbox.c.next_attempt_at)
    ).where(outbox.c.message_id == "lost")

    def attempt(n: int) -> float:
        """Waits for the ``n``th recorded attempt; seconds until the row is due again."""
        seen: list[float] = []

        def recorded() -> bool:
            with engine.connect() as conn:
                attempts, due = conn.execute(due_in).one()
            seen[:] = [float(due)]
            return int(attempts) >= n

        wait_until(recorded, 60, f"attempt {n} recorded")
        return seen[0]

    try:
        with RelayProcess(env, tmp_path / "relay.log") as proc:
            first_due = attempt(1)
            first_at = time.monotonic()
            attempt(2)
            between = time.monotonic() - first_at
            assert proc.stop() == 0
    finally:
        engine.dispose()
    print(
        f"relay {offset}: due again {first_due:.2f} s after the first attempt was recorded, "
        f"second attempt {between:.2f} s later"
    )
    # backoff_initial plus up to backoff_initial of jitter, less the time from the settle to
    # the poll that saw it. A back-off timed by the relay's own clock would be due the skew
    # early (behind: retried at once) or late (ahead: the second attempt's 60-s wait fails):
    # the bounds keep half the skew's margin, which no poll a loaded machine delays uses up.
    assert -SKEW_S / 2 < first_due <= 2 * initial
    assert initial * 0.5 < between
