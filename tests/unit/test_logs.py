"""The relay's log lines: SQLAlchemy's pool hiccups are one warning, not a traceback."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine.interfaces import DBAPIConnection

from relay import logs


class _GoneConnection:
    """A DBAPI connection whose server is gone: handing it back to the pool fails."""

    def rollback(self) -> None:
        raise OSError("Lost connection to server during query")

    def close(self) -> None:
        pass


@pytest.fixture
def root_logging() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _gone() -> DBAPIConnection:
    return _GoneConnection()  # type: ignore[return-value]  # the two methods a pool calls


def _hand_back_a_lost_connection() -> None:
    pool = sa.pool.QueuePool(_gone, reset_on_return="rollback")
    pool.connect().close()
    pool.dispose()


@pytest.mark.usefixtures("root_logging")
def test_a_connection_lost_as_it_is_handed_back_is_one_warning(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure("info", "json")
    _hand_back_a_lost_connection()
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert len(lines) == 1, lines
    assert lines[0]["level"] == "warning"
    assert lines[0]["action"] == "database_connection_discarded"
    assert "Lost connection to server during query" in lines[0]["message"]
    assert "exception" not in lines[0]


@pytest.mark.usefixtures("root_logging")
def test_at_debug_the_pool_keeps_its_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure("debug", "json")
    _hand_back_a_lost_connection()
    errors = [
        line
        for line in map(json.loads, capsys.readouterr().err.splitlines())
        if line["level"] == "error"
    ]
    assert len(errors) == 1, errors
    assert "Traceback" in errors[0]["exception"]
