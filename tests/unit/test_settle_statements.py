"""``Settles.statements`` says how many statements ``write`` runs, for every batch and every
database: a settle that it says is one statement runs in autocommit mode, so one that ran two
would lose its atomicity (its acks committed, its other outcomes not). No I/O: ``write``
runs on a connection that records what it is given."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa

from relay.constants import IDS_PER_STATEMENT
from relay.db.settles import Settles
from relay.records import KEEP_IDS, KEEP_MESSAGES, PENDING, RowChange, SettleBatch

# Each driver's dialect, as the relay's engines have them (making an engine connects nothing).
DIALECTS = {
    name: sa.create_engine(url).dialect
    for name, url in (
        ("postgresql", "postgresql+psycopg://relay@localhost/outbox"),
        ("sqlite", "sqlite://"),
        ("mysql", "mysql+mysqldb://relay@localhost/outbox"),
    )
}
CHANGE = RowChange(7, PENDING, 1, 1.0, "nacked")
MANY = IDS_PER_STATEMENT * 2 + 1
BATCHES = {
    "one ack": SettleBatch(sent=(1,)),
    "acks over several statements": SettleBatch(sent=tuple(range(MANY))),
    "one change": SettleBatch(changes=(CHANGE,)),
    "one duplicate": SettleBatch(duplicates=(3,)),
    "duplicates over several statements": SettleBatch(duplicates=tuple(range(MANY))),
    "everything": SettleBatch(sent=(1, 2), changes=(CHANGE,), duplicates=(3,)),
}


class Recorder:
    """A connection whose every statement changed one row."""

    def __init__(self) -> None:
        self.executed: list[sa.Executable] = []

    def execute(self, statement: sa.Executable, parameters: Any = None) -> Any:
        self.executed.append(statement)
        return type("Result", (), {"rowcount": 1})()


@pytest.mark.parametrize("keep_sent", [KEEP_IDS, KEEP_MESSAGES])
@pytest.mark.parametrize("database", DIALECTS)
@pytest.mark.parametrize("batch", BATCHES)
def test_write_runs_as_many_statements_as_it_says(
    database: str, keep_sent: str, batch: str
) -> None:
    settles = Settles(DIALECTS[database], "relay-a", keep_sent)
    conn = Recorder()
    settles.write(conn, BATCHES[batch], {})  # type: ignore[arg-type]
    assert len(conn.executed) == settles.statements(BATCHES[batch])
