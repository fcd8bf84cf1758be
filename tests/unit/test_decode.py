"""Reading a claimed row: whatever a column holds, one row never fails the others."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from relay.db.decode import decode_row, layout_problem
from relay.db.schema import ROW_COLUMNS

STORED = {
    "id": 7,
    "message_id": "m-7",
    "exchange": "ex",
    "routing_key": "rk",
    "payload": b"p",
    "content_type": "text/plain",
    "headers": None,
    "created_at": "2026-01-01 00:00:00.000000",
    "attempts": 0,
    "last_error": None,
    "suspect": 0,
    "sent_before": False,
    "oversize": None,
}
MAX_MESSAGE = 1000
T = datetime(2026, 1, 1, tzinfo=UTC)


def _row(column: str, stored: Any, **others: Any) -> tuple[Any, ...]:
    """STORED with ``column`` holding ``stored`` (and ``others`` theirs), as the driver
    returns it."""
    values = {**STORED, **others, column: stored}
    return (*(values[c.name] for c in ROW_COLUMNS), values["sent_before"], values["oversize"])


# A stored value -> the field it becomes (the other columns as in STORED).
READABLE = {
    "SQLite text time": ("created_at", "2026-01-01 00:00:00.000000", "created_at", T),
    "SQLite CURRENT_TIMESTAMP": ("created_at", "2026-01-01 00:00:00", "created_at", T),
    "ISO time with offset": ("created_at", "2026-01-01T01:00:00+01:00", "created_at", T),
    "Unix seconds": ("created_at", int(T.timestamp()), "created_at", T),
    "Unix seconds, fractional": (
        "created_at",
        T.timestamp() + 0.5,
        "created_at",
        T + timedelta(seconds=0.5),
    ),
    "PostgreSQL timestamptz": (
        "created_at",
        T.astimezone(timezone(timedelta(hours=2))),
        "created_at",
        T,
    ),
    "naive time is UTC": ("created_at", T.replace(tzinfo=None), "created_at", T),
    "memoryview payload": ("payload", memoryview(b"raw"), "payload", b"raw"),
    # A SQLite database in UTF-16 stored the writer's text, not its bytes: published as UTF-8.
    "text payload": ("payload", "h\u00e9llo", "payload", "h\u00e9llo".encode()),
    "headers text": ("headers", '{"a": 1}', "headers", '{"a": 1}'),
    "SQLite boolean": ("suspect", 1, "suspect", True),
    "PostgreSQL boolean": ("suspect", True, "suspect", True),
    "sent before, PostgreSQL": ("sent_before", True, "sent_before", True),
    "sent before, MySQL and SQLite": ("sent_before", 1, "sent_before", True),
    "not sent before, MySQL and SQLite": ("sent_before", 0, "sent_before", False),
}


@pytest.mark.parametrize(
    ("column", "stored", "field", "value"), READABLE.values(), ids=list(READABLE)
)
def test_stored_values_are_read(column: str, stored: Any, field: str, value: Any) -> None:
    row = decode_row(_row(column, stored), MAX_MESSAGE)
    assert row.unreadable is None
    assert getattr(row, field) == value


UNREADABLE = {
    "INTEGER payload": ("payload", 42, "payload is an INTEGER, not bytes"),
    # Text comes only from a SQLite database in UTF-16 (its TEXT read as text): one holding
    # bytes that were no text is not re-encoded into other bytes.
    "text payload that is no text": (
        "payload",
        "h\udcffllo",
        "payload is not UTF-8 text (byte 0xff at 1)",
    ),
    "REAL payload": ("payload", 4.2, "payload is a REAL"),
    "BLOB routing key": ("routing_key", b"rk", "routing_key is a BLOB, not text"),
    "INTEGER exchange": ("exchange", 5, "exchange is an INTEGER, not text"),
    "INTEGER headers": ("headers", 1, "headers is an INTEGER, not text"),
    "text that is no time": (
        "created_at",
        "yesterday",
        "created_at 'yesterday' is not an ISO-8601 time",
    ),
    "seconds out of range": ("created_at", 10**20, "is not a time in Unix seconds"),
    "BLOB time": ("created_at", b"\x00", "created_at is a BLOB, not a time"),
    "text attempts": ("attempts", "3", "attempts is a str, not a whole number"),
}


@pytest.mark.parametrize(("column", "stored", "reason"), UNREADABLE.values(), ids=list(UNREADABLE))
def test_an_unreadable_row_carries_its_id_and_the_reason(
    column: str, stored: Any, reason: str
) -> None:
    row = decode_row(_row(column, stored), MAX_MESSAGE)
    assert row.id == 7 and row.unreadable is not None
    assert row.unreadable.startswith("unreadable row: ") and reason in row.unreadable


def test_a_row_too_large_to_read_carries_its_id_its_message_id_and_its_size() -> None:
    """The claim returns an oversized row without its payload and headers (NULL), with its
    size: parked with both sizes in the reason, and still known by its message id."""
    row = decode_row(_row("oversize", 5000, payload=None, headers=None, attempts=2), MAX_MESSAGE)
    assert (row.id, row.message_id, row.attempts, row.payload) == (7, "m-7", 2, b"")
    assert row.unreadable is not None
    assert "5000 bytes" in row.unreadable and "1000 bytes" in row.unreadable
    assert "RELAY_MAX_MESSAGE_SIZE" in row.unreadable


def lenient(raw: bytes) -> str:
    """Text as SQLite's connections read it (relay.db.dialects.sqlite): bytes not UTF-8 kept
    as lone surrogates."""
    return raw.decode("utf-8", "surrogateescape")


NOT_UTF8 = {
    "message id": ("message_id", "message_id is not UTF-8 text (byte 0xff at 0)"),
    "exchange": ("exchange", "exchange is not UTF-8 text (byte 0xff at 0)"),
    "routing key": ("routing_key", "routing_key is not UTF-8 text (byte 0xff at 0)"),
    "content type": ("content_type", "content_type is not UTF-8 text (byte 0xff at 0)"),
    "headers": ("headers", "headers is not UTF-8 text (byte 0xff at 0)"),
}


@pytest.mark.parametrize(("column", "reason"), NOT_UTF8.values(), ids=list(NOT_UTF8))
def test_text_that_is_not_utf8_makes_its_row_unreadable_naming_the_column(
    column: str, reason: str
) -> None:
    row = decode_row(_row(column, lenient(b"\xffA")), MAX_MESSAGE, unchecked_text=True)
    assert row.id == 7 and row.unreadable == f"unreadable row: {reason}"
    assert row.message_id.encode()  # shown and logged: UTF-8 whatever was stored


def test_a_last_error_that_is_not_utf8_is_kept_readable_and_the_row_goes_out() -> None:
    """The last error is the operators' and is written back by the relay: its bytes that
    were not UTF-8 become U+FFFD, and the row is published."""
    row = decode_row(_row("last_error", lenient(b"nack \xfe")), MAX_MESSAGE, unchecked_text=True)
    assert row.unreadable is None and row.last_error == "nack \ufffd"


def test_valid_text_beyond_ascii_is_read_as_it_is() -> None:
    row = decode_row(_row("routing_key", "clé.€"), MAX_MESSAGE, unchecked_text=True)
    assert row.unreadable is None and row.routing_key == "clé.€"


COLUMNS = ("id", "message_id", "payload")


@pytest.mark.parametrize(
    ("fields", "claimed", "plain", "problem"),
    [
        ((*COLUMNS, "unreadable", "sent_before"), (*COLUMNS, "sent_before", "oversize"), 5, None),
        (
            ("id", "payload", "message_id", "unreadable", "sent_before"),
            (*COLUMNS, "sent_before", "oversize"),
            5,
            "are not the claim's columns",
        ),
        (
            (*COLUMNS, "sent_before"),
            (*COLUMNS, "sent_before", "oversize"),
            5,
            "are not the claim's columns",
        ),
        (
            (*COLUMNS, "unreadable", "sent_before"),
            (*COLUMNS, "sent_before", "oversize"),
            4,
            "4 plain",
        ),
    ],
)
def test_the_fast_paths_layout_is_checked(
    fields: tuple[str, ...], claimed: tuple[str, ...], plain: int, problem: str | None
) -> None:
    """``decode_row`` builds rows by position: a claim column, an ``OutboxRow`` field or a
    plain type out of step is found (at import, for the real ones)."""
    found = layout_problem(fields, claimed, plain)
    assert found is None if problem is None else problem in (found or "")
