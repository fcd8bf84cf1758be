"""A claimed row, from the values the database driver returned to an ``OutboxRow``. Pure.

The claim reads the columns as the driver returns them, without SQLAlchemy's result
processing: SQLite stores any value in any column, and one row's INTEGER payload or epoch
``created_at`` must not fail the claim of the whole batch. Each row is read on its own here;
one that cannot be read, or that was too large to be read at all, comes back saying why, and
is parked (``relay.message``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from relay.db.schema import ROW_COLUMNS
from relay.message import too_large_to_read
from relay.records import OutboxRow

# The types of a row's values, in ``ROW_COLUMNS`` order, in a well-formed row; created_at is
# any of the forms ``_time`` reads.
_OR_NULL = (str, type(None))
_PLAIN: tuple[type | tuple[type, ...], ...]
_PLAIN = (int, str, str, str, bytes, str, _OR_NULL, object, int, _OR_NULL, int, object, type(None))
# An ``OutboxRow`` of all its fields in order, without the keyword handling of its
# constructor: one per row claimed.
_row = functools.partial(tuple.__new__, OutboxRow)
# The claim's columns: the row's, whether its message id is in the sent log, and its size
# when it is over the largest message the relay reads (its payload and headers then NULL).
_NAMES = (*(c.name for c in ROW_COLUMNS), "sent_before", "oversize")
# The text columns, and what stands in a text for a byte that was not UTF-8 (Python's
# ``surrogateescape``: U+DC80 to U+DCFF).
_TEXT_AT = tuple(
    _NAMES.index(c)
    for c in ("message_id", "exchange", "routing_key", "content_type", "headers", "last_error")
)
_SURROGATE = re.compile("[\udc80-\udcff]")


def layout_problem(row_fields: tuple[str, ...], claimed: tuple[str, ...], plain: int) -> str | None:
    """What keeps ``decode_row``'s fast path from building rows by position, or None: it
    takes the claim's values (``claimed``: the row's columns, ``sent_before``, ``oversize``)
    as ``OutboxRow``'s fields in order (``row_fields``: the columns', then ``unreadable``
    and ``sent_before``), one type in ``_PLAIN`` (``plain`` of them) per value."""
    columns = claimed[:-2]
    if row_fields != (*columns, "unreadable", "sent_before"):
        return f"OutboxRow's fields {row_fields} are not the claim's columns {columns} in order"
    if plain != len(claimed):
        return f"{plain} plain types for {len(claimed)} claimed values"
    return None


# Checked once, at import: a column added to the claim and not to ``OutboxRow`` (or the
# other way round) would otherwise shift every field of every row claimed.
if (_problem := layout_problem(OutboxRow._fields, _NAMES, len(_PLAIN))) is not None:
    raise ImportError(_problem)


def decode_row(
    values: Sequence[Any], max_message_size: int, unchecked_text: bool = False
) -> OutboxRow:
    """A claimed row from the driver's values, in ``ROW_COLUMNS`` order, then whether its
    message id is in the sent log (``sent_before``; a bool, or 0/1), then its size if it is
    larger than ``max_message_size`` (``oversize``; NULL otherwise). A row that cannot be
    read, or was too large to be read, comes back with ``unreadable`` saying why, and is
    parked (``relay.message``).

    A row whose values all have their column's type is taken as it is, its time read:
    checking and converting each value one by one cost 3.3 us per row (``bench.run
    --profile``), a quarter of what the bare publisher spends on a whole message.

    ``unchecked_text``: the driver returned text it did not check is UTF-8 (SQLite's, read
    leniently by ``relay.db.dialects.sqlite``: bytes that are not UTF-8 come as lone
    surrogates), so each text value is checked here, and a row with one is parked naming its
    column; and its size, which a SQLite database in UTF-16 counts from below, is checked
    once read: such a row over ``max_message_size`` is parked by its exact size."""
    try:
        if all(map(isinstance, values, _PLAIN)) and not (
            unchecked_text and _not_utf8(values) is not None
        ):
            (
                rid,
                message_id,
                exchange,
                key,
                payload,
                content,
                headers,
                at,
                tries,
                error,
                sus,
                again,
                _,
            ) = values
            created = _time(at)
            fast = _row(
                (
                    rid,
                    message_id,
                    exchange,
                    key,
                    payload,
                    content,
                    headers,
                    created,
                    tries,
                    error,
                    bool(sus),
                    None,
                    bool(again),
                )
            )
            if not (unchecked_text and _over(fast, max_message_size)):
                return fast
        raw = dict(zip(_NAMES, values, strict=True))
        if raw["oversize"] is not None:
            return _unread(raw, too_large_to_read(raw["oversize"], max_message_size))
        row = OutboxRow(
            id=raw["id"],
            message_id=_text(raw, "message_id"),
            exchange=_text(raw, "exchange"),
            routing_key=_text(raw, "routing_key"),
            payload=_payload(raw["payload"]),
            content_type=_text(raw, "content_type"),
            headers=None if raw["headers"] is None else _text(raw, "headers"),
            created_at=_time(raw["created_at"]),
            attempts=_attempts(raw["attempts"]),
            last_error=None if raw["last_error"] is None else readable_text(str(raw["last_error"])),
            suspect=bool(raw["suspect"]),
            sent_before=bool(raw["sent_before"]),
        )
        # A SQLite database in UTF-16 sizes its text from below (``relay.db.dialects``):
        # the bytes published, payload and headers, are checked once read.
        if size := _over(row, max_message_size):
            return _unread(raw, too_large_to_read(size, max_message_size))
        return row
    except _Unreadable as exc:
        return _unread(dict(zip(_NAMES, values, strict=True)), f"unreadable row: {exc}")


def _over(row: OutboxRow, max_message_size: int) -> int:
    """The bytes ``row``'s message carries (payload and headers, as published) if over
    ``max_message_size`` (0: no limit), else 0."""
    size = len(row.payload) + len((row.headers or "").encode())
    return size if max_message_size and size > max_message_size else 0


def _unread(raw: Mapping[str, Any], reason: str) -> OutboxRow:
    """A row that carries only its id (and what of its message id and attempts can be read),
    to be parked for ``reason``."""
    message_id = readable_text(raw["message_id"]) if isinstance(raw["message_id"], str) else ""
    attempts = raw["attempts"] if isinstance(raw["attempts"], int) else 0
    return OutboxRow(
        id=raw["id"],
        message_id=message_id,
        exchange="",
        routing_key="",
        payload=b"",
        content_type="",
        headers=None,
        created_at=datetime.fromtimestamp(0, UTC),
        attempts=attempts,
        unreadable=reason,
        sent_before=bool(raw["sent_before"]),
    )


class _Unreadable(ValueError):
    pass


def _stored(value: Any) -> str:
    kinds = {int: "an INTEGER", float: "a REAL", bytes: "a BLOB", memoryview: "a BLOB"}
    return kinds.get(type(value), f"a {type(value).__name__}")


def _text(raw: Mapping[Any, Any], column: str) -> str:
    value = raw[column]
    if not isinstance(value, str):
        raise _Unreadable(f"{column} is {_stored(value)}, not text")
    if not value.isascii() and (bad := _SURROGATE.search(value)) is not None:
        byte = ord(bad[0]) - 0xDC00
        raise _Unreadable(f"{column} is not UTF-8 text (byte 0x{byte:02x} at {bad.start()})")
    return value


def readable_text(value: str) -> str:
    """``value`` with any byte that was not UTF-8 as U+FFFD: for what the relay only shows
    or writes back (a row's last error, a parked row's message id)."""
    if value.isascii() or _SURROGATE.search(value) is None:
        return value
    return value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def _not_utf8(values: Sequence[Any]) -> str | None:
    """The first text column of a row whose value has bytes that were not UTF-8, or None."""
    for i in _TEXT_AT:
        value = values[i]
        if type(value) is str and not value.isascii() and _SURROGATE.search(value):
            return _NAMES[i]
    return None


def _payload(value: Any) -> bytes:
    # Published as the bytes stored, or not at all: the claim reads a payload as bytes on
    # every database (SQLite's TEXT as its BLOB: ``relay.db.dialects``). A text comes only
    # from a SQLite database whose encoding is UTF-16, which converted the writer's text
    # when it stored it: published as UTF-8, or parked when it holds no text.
    if isinstance(value, bytes | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return _text({"payload": value}, "payload").encode()
    raise _Unreadable(f"payload is {_stored(value)}, not bytes")


def _time(value: Any) -> datetime:
    """created_at: a timestamp (PostgreSQL), ISO-8601 text or Unix seconds (SQLite). An aware
    timestamp keeps its zone (only its instant is used): converting it cost 0.6 us a row."""
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            return value
        moment = value
    elif isinstance(value, str):
        try:
            moment = datetime.fromisoformat(value)
        except ValueError:
            raise _Unreadable(f"created_at {value[:40]!r} is not an ISO-8601 time") from None
    elif isinstance(value, int | float) and not isinstance(value, bool):
        try:
            moment = datetime.fromtimestamp(value, UTC)
        except (OverflowError, OSError, ValueError):
            raise _Unreadable(f"created_at {value!r} is not a time in Unix seconds") from None
    else:
        raise _Unreadable(f"created_at is {_stored(value)}, not a time")
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def _attempts(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise _Unreadable(f"attempts is {_stored(value)}, not a whole number")
    return value
