"""Pure: what a request asks of the console, read from its query or form fields and checked:
a filter, a page's cursor, the bound a page was drawn at, ids, a dead letter and a page's
position among them; and a payload's preview, a letter's properties as text.

Any text is accepted as a filter value and bound as a parameter (never spliced into SQL);
what no database can hold (a NUL, text over ``MAX_FIELD`` characters) is refused with the
field's name.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from relay.broker.deadletter_pages import Position
from relay.causes import UNSORTED
from relay.console_records import ArchiveFilter, AuditFilter, Cursor, ParkedFilter
from relay.errors import InputError

MAX_FIELD = 1000
# The years a time a form gives may fall in (``_within_years``).
FIRST_YEAR, LAST_YEAR = 1900, 9000
FILTER_FIELDS = (
    "reason",
    "cause",
    "exchange",
    "routing_key",
    "ordering_key",
    "message_id",
    "message_prefix",
)
_AGE = re.compile(r"\s*(\d+)\s*([smhd])\s*")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
# The greatest row id: the id column's 64 bits, signed.
ROW_ID_MAX = 2**63 - 1
_PRINTABLE = set(string.printable) - set("\x0b\x0c")
_DIGEST = re.compile(r"[0-9a-f]{32}")
# A queue position: far past any queue's length, short enough to refuse a 10,000-digit one
# before it is read as a number.
_POSITION_DIGITS = 12
# A message's AMQP properties, in their order (its headers aside).
_PROPERTIES = (
    "content_type",
    "content_encoding",
    "delivery_mode",
    "priority",
    "correlation_id",
    "reply_to",
    "expiration",
    "message_id",
    "timestamp",
    "type",
    "user_id",
    "app_id",
)


def text(fields: Mapping[str, str], name: str, longest: int = MAX_FIELD) -> str:
    value = fields.get(name, "")
    if len(value) > longest:
        raise InputError(f"{name}: longer than {longest} characters")
    if "\x00" in value:
        raise InputError(f"{name}: holds a NUL character, which no row can")
    return value


def letter_digest(value: str) -> str:
    """A dead letter as a page names it: its digest (``relay.broker.deadletters.digest``),
    whatever its key (a NUL, bytes that are not UTF-8, none at all)."""
    if not _DIGEST.fullmatch(value):
        raise InputError("letter: not a dead letter as the page named it")
    return value


def letter_position(fields: Mapping[str, str]) -> Position:
    """Where a page of dead letters starts: after the letter ``after`` names, which was at
    ``at``, or at ``then`` (the letter that followed it); the queue's head without them."""
    after = fields.get("after", "")
    if not after:
        return Position()
    at = fields.get("at", "")
    if not (at.isascii() and at.isdigit()) or len(at) > _POSITION_DIGITS:
        raise InputError("at: not a position in a queue")
    then = fields.get("then", "")
    return Position(letter_digest(after), int(at), letter_digest(then) if then else "")


def letter_properties(properties: Any) -> list[tuple[str, str]]:
    """A letter's AMQP properties and headers as text to show (bytes that are not UTF-8 as
    U+FFFD), those it has, in AMQP's order; headers last, each as ``header name``."""
    shown = [
        (name, _shown(value))
        for name in _PROPERTIES
        if (value := getattr(properties, name, None)) is not None
    ]
    headers = getattr(properties, "headers", None) or {}
    return shown + [(f"header {name}", _shown(value)) for name, value in headers.items()]


def _shown(value: object) -> str:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return str(value)


def age(fields: Mapping[str, str]) -> timedelta | None:
    """``parked_for``: rows parked at least this long ago (``90s``, ``15m``, ``2h``, ``7d``)."""
    given = text(fields, "parked_for")
    if not given:
        return None
    match = _AGE.fullmatch(given)
    if match is None:
        raise InputError(f"parked_for: {given!r} is not an age such as 15m, 2h or 7d")
    try:
        return timedelta(seconds=int(match[1]) * _UNITS[match[2]])
    except OverflowError:
        raise InputError(f"parked_for: {given!r} is longer than any row has waited") from None


def instant(fields: Mapping[str, str], name: str) -> datetime | None:
    given = text(fields, name)
    if not given:
        return None
    try:
        value = datetime.fromisoformat(given)
    except ValueError:
        value = None
    if value is None or value.tzinfo is None:
        raise InputError(f"{name}: not a time with its offset")
    return _within_years(value, name)


def _within_years(value: datetime, name: str) -> datetime:
    """``value`` in UTC, refused at the calendar's ends: the year 1 with an offset east of
    UTC is no time in UTC, and a page's bound less the settle horizon, or an age counted
    back from it, must stay a time (each was a 500, or a 503 "try again", from the
    driver's overflow)."""
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not FIRST_YEAR <= utc.year <= LAST_YEAR:
        raise InputError(f"{name}: not a time between the years {FIRST_YEAR} and {LAST_YEAR}")
    return utc


def audit_filter(fields: Mapping[str, str]) -> AuditFilter:
    """The audit page's filter: a user (as entries name them, or an OpenID Connect
    subject), an action, and a time range. A time without an offset (a browser's
    ``datetime-local`` field) is UTC, as the page says."""
    since, until = _time_range(fields)
    return AuditFilter(
        actor=text(fields, "user").strip(),
        action=text(fields, "action").strip(),
        since=since,
        until=until,
    )


# The archive's filter, as its form, links and changes name the fields.
ARCHIVE_FIELDS = ("discarded_by", "exchange", "reason", "since", "until")


def archive_filter(fields: Mapping[str, str]) -> ArchiveFilter:
    """The archive's filter: who discarded the rows (as the audit log names them), when (a
    time without an offset is UTC, as the page says), their exchange and a part of their
    last error."""
    since, until = _time_range(fields)
    return ArchiveFilter(
        discarded_by=text(fields, "discarded_by").strip(),
        exchange=text(fields, "exchange"),
        reason=text(fields, "reason"),
        since=since,
        until=until,
    )


def utc_range(first: datetime, last: datetime) -> dict[str, str]:
    """``since`` and ``until`` fields that take in every time from ``first`` to ``last``,
    whole seconds in UTC, as a ``datetime-local`` field shows them (it drops a value with
    an offset or microseconds)."""
    start = first.astimezone(UTC).replace(microsecond=0, tzinfo=None)
    end = last.astimezone(UTC).replace(tzinfo=None)
    if end.microsecond:
        end = end.replace(microsecond=0) + timedelta(seconds=1)
    return {"since": start.isoformat(), "until": end.isoformat()}


def _time_range(fields: Mapping[str, str]) -> tuple[datetime | None, datetime | None]:
    """A filter's ``since`` and ``until`` (``_utc``), the first no later than the second."""
    since, until = (_utc(fields, name) for name in ("since", "until"))
    if since is not None and until is not None and since > until:
        raise InputError("since: later than until")
    return since, until


def _utc(fields: Mapping[str, str], name: str) -> datetime | None:
    given = text(fields, name).strip()
    if not given:
        return None
    try:
        value = datetime.fromisoformat(given)
    except ValueError:
        raise InputError(f"{name}: not a time such as 2026-11-29T14:05 (UTC)") from None
    return _within_years(value.replace(tzinfo=UTC) if value.tzinfo is None else value, name)


def parked_filter(fields: Mapping[str, str], now: datetime) -> ParkedFilter:
    """The filter the fields ask for; ``cause`` named by its text (``relay.causes``); an age
    counted back from ``now`` (the database's time)."""
    since = age(fields)
    before = instant(fields, "parked_before")
    if since is not None:
        try:
            before = _within_years(now - since, "parked_for")
        except OverflowError:
            raise InputError("parked_for: longer than any row has waited") from None
    return ParkedFilter(
        reason=text(fields, "reason"),
        cause=text(fields, "cause"),
        exchange=text(fields, "exchange"),
        routing_key=text(fields, "routing_key"),
        ordering_key=text(fields, "ordering_key"),
        message_id=text(fields, "message_id"),
        message_prefix=text(fields, "message_prefix"),
        parked_before=before,
    )


def change_filter(fields: Mapping[str, str], bound: datetime) -> ParkedFilter:
    """A bulk change's filter (``parked_filter``), but not the rows without a cause yet: the
    relays are giving them theirs, each leaving the filter as it is sorted, and a change's
    chunks missed them unnamed (an outside review: 2,200 of 20,000 changed, none said
    left)."""
    chosen = parked_filter(fields, bound)
    if chosen.cause == UNSORTED:
        raise InputError(
            "cause: the relays are giving these rows their causes; change them by their "
            "cause once sorted (100,000 a minute), or by another filter"
        )
    return chosen


def cursor(fields: Mapping[str, str]) -> Cursor | None:
    at = instant(fields, "after_t")
    row = text(fields, "after_id")
    if at is None and not row:
        return None
    if at is None or not row:
        raise InputError("after_t and after_id: a page's cursor is both")
    return Cursor(at, row_id(row, "after_id"))


def count(fields: Mapping[str, str], name: str) -> int:
    """A count a form carries back (a queue's depth as a confirmation saw it): ASCII digits,
    at most a queue's 32 bits."""
    given = fields.get(name, "")
    if not (given.isascii() and given.isdigit()) or int(given) >= 2**32:
        raise InputError(f"{name}: not a count")
    return int(given)


def row_id(value: str | int, name: str = "id") -> int:
    """A row's id as given (a form's field, a path's part): ASCII digits, within the
    column's 64 bits (past them the driver failed, a 500 with its traceback)."""
    given = str(value)
    if not (given.isascii() and given.isdigit()) or not 0 < int(given) <= ROW_ID_MAX:
        raise InputError(f"{name}: not a row id")
    return int(given)


def ids(values: Sequence[str]) -> list[int]:
    if not values:
        raise InputError("no rows chosen")
    return sorted({row_id(v) for v in values})


def preview(payload: bytes, size: int) -> tuple[str, str]:
    """A payload's preview as shown: ``("text", ...)`` when its bytes are printable UTF-8
    (a character cut at the preview's end aside), else ``("hex", ...)``: offset, bytes and
    their printable ASCII, 16 a line. Never markup: the page escapes it as text."""
    cut = len(payload) < size
    try:
        shown = payload.decode("utf-8")
    except UnicodeDecodeError as exc:
        shown = (
            payload[: exc.start].decode("utf-8") if cut and exc.start >= len(payload) - 3 else ""
        )
        if not shown and payload:
            return "hex", hex_dump(payload)
    if all(c in _PRINTABLE or (c.isprintable() and ord(c) > 127) for c in shown):
        return "text", shown
    return "hex", hex_dump(payload)


def hex_dump(data: bytes) -> str:
    lines = []
    for offset in range(0, len(data), 16):
        chunk = data[offset : offset + 16]
        ascii_ = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{offset:08x}  {chunk.hex(' '):<47}  {ascii_}")
    return "\n".join(lines)


def as_submitted(value: str, multiline: bool) -> str:
    """``value`` as a browser posts it back from a form field showing it: a textarea's line
    breaks each become CRLF (HTML's form encoding); a text input's are dropped."""
    if not multiline:
        return value.replace("\r", "").replace("\n", "")
    return value.replace("\r\n", "\n").replace("\r", "\n").replace("\n", "\r\n")


def edited(original: str | None, submitted: str, multiline: bool) -> str | None:
    """What an edit form's field asks to store: None when it is ``original`` as the browser
    posts it back (unchanged: the original's bytes are kept, never the browser's), else the
    text submitted, its CRLFs back to LFs when the original had no CR (a textarea turns
    every line break into CRLF)."""
    if original is not None and submitted == as_submitted(original, multiline):
        return None
    if multiline and "\r" not in (original or ""):
        return submitted.replace("\r\n", "\n")
    return submitted
