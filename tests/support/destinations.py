"""What the tests of a broken destination (devtools.destinations) ask of the relay."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from devtools.destinations import BAD, GOOD, LATE, SETTINGS, WINDOW, broken_destination
from devtools.servers import PostgresServer


def fresh_database(postgres: PostgresServer) -> str:
    """A new migrated database (as the ``postgresql_url`` fixture makes one)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    postgres.psql(f"CREATE DATABASE {name} TEMPLATE outbox_template")
    return postgres.url(name)


def check(tmp: Path, amqp_url: str, postgres: PostgresServer) -> None:
    """The scenario. Asserted: one connection, a few lines about the destination, every bad
    row parked after its attempts with the broker's reason, every good row delivered
    (duplicates within a window), and every late row sent once the exchange exists. The
    good rows' rate against the same rows alone is bench/destinations.py's, by hand: a
    timed assertion on a shared machine is not a test."""
    report = broken_destination(tmp, amqp_url, fresh_database(postgres))
    print(json.dumps(report.figures()))
    assert report.connections == 1, f"{report.connections} connections opened"
    assert len(report.destination_lines) <= 10, report.destination_lines
    [(reason, parked)] = report.parked_reasons.items()
    assert parked == BAD and "404 NOT_FOUND - no exchange" in reason, report.parked_reasons
    assert report.parked_attempts == {int(SETTINGS["RELAY_MAX_ATTEMPTS"])}
    missing = {f"good-{i}" for i in range(GOOD)} - set(report.good_delivered)
    assert not missing, f"{len(missing)} good rows sent and not consumed, e.g. {min(missing)}"
    duplicates = len(report.good_delivered) - GOOD
    assert duplicates <= WINDOW, f"{duplicates} good rows delivered twice"
    assert report.late_delivered == LATE
