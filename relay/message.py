"""From an outbox row to the AMQP message it becomes, or the reason it never can. Pure: no I/O.

Every check here is against a limit of AMQP 0-9-1 (as RabbitMQ implements it) or one the
broker has shown, and every reason names the column and the limit, so that an operator who
reads ``last_error`` knows what to fix. A row that fails here is parked at once: no retry
could make it publishable.

Headers are stored as JSON text (any writer can produce it); the mapping to an AMQP field
table is total and documented in the README:

=================================  =====================================================
JSON                               AMQP field value (RabbitMQ's type letter)
=================================  =====================================================
string                             long string ``S`` (UTF-8)
true / false                       boolean ``t``
null                               void ``V``
integer in [-2**31, 2**31)         32-bit signed ``I``
integer in [-2**63, 2**63)         64-bit signed ``l``
other integers                     parked: AMQP has no wider integer
number with a fraction/exponent    decimal ``D`` when its digits fit (a 32-bit mantissa,
                                   0-255 decimal places: ``19.99``, ``0.5``), else double
                                   ``d`` when it is a double (``0.30000000000000004``,
                                   ``3.141592653589793``, ``1.5e10``); parked when neither
                                   holds it exactly (more digits than a double, or beyond
                                   a double's range)
array                              array ``A``
object                             table ``F`` (keys at most 255 bytes of UTF-8)
=================================  =====================================================

Nesting deeper than ``MAX_HEADER_DEPTH`` is parked (RabbitMQ and clients decode tables
recursively). The headers are encoded here, not by pika: pika 1.3 cannot encode a double,
and would encode a large decimal into a 32-bit field it does not check.
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

from relay.records import OutboxRow

SHORT_STRING_MAX = 255  # bytes: exchange, routing key, message id, content type, header keys
LONG_STRING_MAX = 2**32 - 1  # bytes: a header string value, an encoded table
# Tables within tables within arrays...: deeper than any sensible header, shallow enough for
# every decoder on the way (RabbitMQ's, clients', this module's) to recurse safely.
MAX_HEADER_DEPTH = 32
# The properties travel in one content-header frame, which must fit the connection's
# negotiated frame_max: 7 bytes of frame header and 1 frame-end octet around 12 bytes of
# class id, weight and body size, then the properties.
CONTENT_HEADER_OVERHEAD = 8 + 12
PERSISTENT = 2  # delivery_mode: the broker writes the message to disk
# Basic properties' flag bits (AMQP 0-9-1, 4.2.6.1), for those the relay sets.
_CONTENT_TYPE, _HEADERS, _DELIVERY_MODE, _MESSAGE_ID, _TIMESTAMP = (
    1 << b for b in (15, 13, 12, 7, 6)
)
# CloudEvents in binary mode (``cloudevent``): the specification's version the relay writes.
CLOUDEVENTS_SPEC_VERSION = "1.0"
_PERSISTENT = bytes([PERSISTENT])
_FLAGS_FIELD = struct.Struct(">H")
_TIMESTAMP_FIELD = struct.Struct(">Q")
_I32 = range(-(2**31), 2**31)
_I64 = range(-(2**63), 2**63)
_DECIMAL_MANTISSA = _I32  # an AMQP decimal's mantissa is a signed 32-bit integer


class Unpublishable(ValueError):
    """The row can never be published as stored; the message says which column and why."""


@dataclass(frozen=True, slots=True)
class Limits:
    """What the broker connection allows (0: no limit known)."""

    frame_max: int = 0  # negotiated at connect: the properties must fit one frame
    max_message_size: int = 0  # bytes of body; learned from the broker's 406 close


class Message(NamedTuple):
    """A row as it goes on the wire: every field checked against the protocol's limits. A
    named tuple, as ``OutboxRow`` is, and for the same reason: one per row published."""

    exchange: str
    routing_key: str
    body: bytes
    properties: bytes  # encoded: content type, headers, persistent, message id, timestamp


def build(
    row: OutboxRow,
    limits: Limits = Limits(),
    trace: Mapping[str, str] | None = None,
    cloudevents_source: str | None = None,
) -> Message:
    """The message for ``row``; raises Unpublishable naming the column and the limit.
    ``trace``: headers set in place of the row's own (the relay's publish span's context).
    ``cloudevents_source``: the message as a CloudEvent in binary mode (``cloudevent``), with
    this source unless the row's headers name one."""
    if row.unreadable is not None:
        raise Unpublishable(row.unreadable)
    # Encoded where they go on the wire (``relay.broker.frames``); here only checked.
    _check_short("exchange", row.exchange)
    _check_short("routing_key", row.routing_key)
    if limits.max_message_size and len(row.payload) > limits.max_message_size:
        raise Unpublishable(
            f"payload is {len(row.payload)} bytes, larger than configured max size "
            f"{limits.max_message_size} (the broker's max_message_size)"
        )
    flags = _CONTENT_TYPE | _DELIVERY_MODE | _MESSAGE_ID | _TIMESTAMP
    pieces = [short_string("content_type", row.content_type)]
    if cloudevents_source is not None:
        flags |= _HEADERS
        pieces.append(_table(cloudevent(row, cloudevents_source, trace), "", 1))
    elif row.headers is not None or trace:
        flags |= _HEADERS
        pieces.append(encode_headers(row.headers or "{}", trace))
    pieces += [
        _PERSISTENT,
        short_string("message_id", row.message_id),
        _TIMESTAMP_FIELD.pack(_timestamp(row.created_at)),
    ]
    properties = _FLAGS_FIELD.pack(flags) + b"".join(pieces)
    if limits.frame_max and len(properties) + CONTENT_HEADER_OVERHEAD > limits.frame_max:
        raise Unpublishable(
            f"the message properties (mostly headers) encode to {len(properties)} bytes; they "
            f"must fit one frame (frame_max {limits.frame_max} bytes, "
            f"{CONTENT_HEADER_OVERHEAD} of them overhead)"
        )
    return Message(row.exchange, row.routing_key, row.payload, properties)


def cloudevent(
    row: OutboxRow, source: str, trace: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """The row's headers with the CloudEvents attributes of binary mode as ``ce-`` headers,
    as the AMQP 0-9-1 convention of Knative's RabbitMQ broker has them (the data content
    type is the message's content type), and every attribute as the CloudEvents SDK's reader
    takes it; raises Unpublishable naming the header otherwise.

    A header is an attribute whatever the case of its ``ce-`` prefix and name (the SDK reads
    them lower-cased), and is written lower-cased. ``ce-id`` is the message id and
    ``ce-specversion`` 1.0: a row may repeat them, not change them. ``ce-source``, ``ce-type``
    and ``ce-time`` are the row's own if it has them (the time an RFC 3339 time with its
    offset), else ``source``, the routing key and the row's creation. ``ce-subject`` and
    ``ce-dataschema``, if present, are text that is not empty, as are the id and the data
    content type. An extension's name is
    lower-case letters and digits; ``data`` and ``datacontenttype`` are not the row's to
    set (the data content type is its ``content_type``)."""
    headers: dict[str, Any] = {}
    named: dict[str, str] = {}  # lower-cased attribute header -> the row's spelling
    for name, value in _parsed(row.headers or "{}").items():
        lowered = name.lower()
        if not lowered.startswith(_CE):
            headers[name] = value
            continue
        if lowered in named:
            raise Unpublishable(
                f"headers {named[lowered]!r} and {name!r} name one CloudEvents attribute"
            )
        named[lowered] = name
        headers[lowered] = _attribute(lowered[len(_CE) :], name, value, row)
    if not row.content_type:
        raise Unpublishable("a CloudEvent's data content type (content_type) must not be empty")
    if not row.message_id:
        raise Unpublishable("a CloudEvent's id (the row's message_id) must not be empty")
    headers.setdefault("ce-source", source)
    headers.setdefault("ce-type", row.routing_key)
    for attribute, fallback in (
        ("ce-source", "RELAY_CLOUDEVENTS_SOURCE"),
        ("ce-type", "the routing key"),
    ):
        if not isinstance(headers[attribute], str) or not headers[attribute]:
            raise Unpublishable(
                f"a CloudEvent needs a {attribute} of text: the row's {attribute} header, "
                f"else {fallback}"
            )
    headers.setdefault("ce-time", row.created_at.astimezone(UTC).isoformat().replace("+00:00", "Z"))
    headers.update({"ce-id": row.message_id, "ce-specversion": CLOUDEVENTS_SPEC_VERSION})
    texts = {"content_type": row.content_type, "message_id": row.message_id}
    texts.update((name, value) for name, value in headers.items() if name.startswith(_CE))
    for name, value in texts.items():
        if isinstance(value, str) and (control := _CONTROL.search(value)):
            raise Unpublishable(
                f"{_shown(name)} holds the control character U+{ord(control.group()):04X}, "
                "which a CloudEvent's text may not"
            )
    headers.update(trace or {})
    return headers


_CE = "ce-"
# CloudEvents' type system leaves the control characters out of its strings (U+0000-U+001F,
# U+007F-U+009F): its bindings cannot carry them (a header of HTTP, for one).
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_ATTRIBUTE_NAME = re.compile("[a-z0-9]+")
# Attributes a row's headers may not set: the relay's own, or the message's.
_NOT_THE_ROWS = {
    "data": "is reserved by CloudEvents",
    "datacontenttype": "is the row's content_type: set that instead",
}


def _attribute(attribute: str, header: str, value: Any, row: OutboxRow) -> Any:
    """A row's CloudEvents attribute header's value, checked (``cloudevent``)."""
    if not _ATTRIBUTE_NAME.fullmatch(attribute):
        raise Unpublishable(
            f"header {_shown(header)}: a CloudEvents attribute's name is lower-case letters "
            "and digits only"
        )
    if attribute in _NOT_THE_ROWS:
        raise Unpublishable(f"header {_shown(header)}: {attribute} {_NOT_THE_ROWS[attribute]}")
    if attribute == "id" and value != row.message_id:
        raise Unpublishable(
            f"header {_shown(header)}: a CloudEvent's id is the row's message_id; set "
            "message_id to it"
        )
    if attribute == "specversion" and value != CLOUDEVENTS_SPEC_VERSION:
        raise Unpublishable(
            f"header {_shown(header)}: the relay writes CloudEvents "
            f"{CLOUDEVENTS_SPEC_VERSION}, not {value!r}"
        )
    if attribute == "time" and not _rfc3339(value):
        raise Unpublishable(
            f"header {_shown(header)}: a CloudEvent's time is an RFC 3339 time with its "
            "offset (2026-01-01T00:00:00Z)"
        )
    if attribute in ("source", "type", "subject", "dataschema") and (
        not isinstance(value, str) or not value
    ):
        raise Unpublishable(
            f"header {_shown(header)}: a CloudEvent's {attribute} is text, not empty"
        )
    return value


def _rfc3339(value: Any) -> bool:
    if not isinstance(value, str) or "T" not in value.upper():
        return False
    try:
        parsed = datetime.fromisoformat(value.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return False
    return parsed.tzinfo is not None


def too_large_to_read(size: int, max_message_size: int) -> str:
    """Why a row of ``size`` bytes of payload and headers is parked unread: the relay reads
    no message larger than ``max_message_size`` (its setting; ``relay.db.due``)."""
    return (
        f"row not read: its payload and headers are {size} bytes, more than the largest "
        f"message the relay reads ({max_message_size} bytes, RELAY_MAX_MESSAGE_SIZE)"
    )


def _check_short(column: str, value: str) -> None:
    """Raise unless ``value`` fits an AMQP short string; without encoding it when it is too
    short to be too long (UTF-8 takes at most 4 bytes a character)."""
    if len(value) > SHORT_STRING_MAX // 4:
        short_string(column, value)


def short_string(column: str, value: str) -> bytes:
    """``value`` encoded as an AMQP short string (length octet, UTF-8)."""
    raw = value.encode("utf-8", "surrogatepass")
    if len(raw) > SHORT_STRING_MAX:
        raise Unpublishable(
            f"{column} is {len(raw)} bytes; AMQP allows at most {SHORT_STRING_MAX} (a short string)"
        )
    return struct.pack("B", len(raw)) + raw


def _timestamp(created_at: datetime) -> int:
    """Unix seconds of an aware time (``OutboxRow.created_at`` always is), whatever its
    zone: the instant is what counts, and converting it to UTC first cost 0.6 us a row."""
    seconds = int(created_at.timestamp())
    if seconds < 0:
        raise Unpublishable(
            f"created_at {created_at.isoformat()} is before 1970: AMQP's timestamp is unsigned"
        )
    return seconds


def encode_headers(text: str, replace: Mapping[str, str] | None = None) -> bytes:
    """The JSON object ``text`` as an encoded AMQP field table (see the module docstring),
    with the keys of ``replace`` set to its values."""
    parsed = _parsed(text)
    if replace:
        parsed.update(replace)
    return _table(parsed, "", 1)


def _parsed(text: str) -> dict[str, Any]:
    """The headers' JSON text as a dict; raises Unpublishable when it is not an object."""
    try:
        parsed = json.loads(text, parse_float=Decimal, parse_int=int, parse_constant=_constant)
    except RecursionError:
        raise Unpublishable(
            f"headers are nested deeper than {MAX_HEADER_DEPTH} levels (JSON too deep to read)"
        ) from None
    except ValueError as exc:
        raise Unpublishable(f"headers are not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise Unpublishable("headers must be a JSON object")
    return parsed


def _constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _table(table: dict[str, Any], path: str, depth: int) -> bytes:
    if depth > MAX_HEADER_DEPTH:
        raise Unpublishable(f"headers are nested deeper than {MAX_HEADER_DEPTH} levels")
    pieces = []
    for key, value in table.items():
        where = f"{path}.{key}" if path else key
        pieces += [short_string(f"header key {_shown(where)}", key), _value(value, where, depth)]
    return _sized(b"".join(pieces), "headers")


def _value(value: Any, where: str, depth: int) -> bytes:
    if isinstance(value, str):
        return b"S" + _sized(value.encode("utf-8", "surrogatepass"), f"header {_shown(where)}")
    if isinstance(value, bool):
        return b"t" + struct.pack("B", value)
    if value is None:
        return b"V"
    if isinstance(value, int):
        if value in _I32:
            return b"I" + struct.pack(">i", value)
        if value in _I64:
            return b"l" + struct.pack(">q", value)
        raise Unpublishable(
            f"header {_shown(where)}: the integer {_number(value)} is outside AMQP's 64-bit range"
        )
    if isinstance(value, Decimal):
        return _fraction(value, where)
    if isinstance(value, list):
        if depth + 1 > MAX_HEADER_DEPTH:
            raise Unpublishable(f"headers are nested deeper than {MAX_HEADER_DEPTH} levels")
        items = b"".join(_value(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value))
        return b"A" + _sized(items, f"header {_shown(where)}")
    if isinstance(value, dict):
        return b"F" + _table(value, where, depth + 1)
    raise Unpublishable(f"header {_shown(where)}: {type(value).__name__} has no AMQP type")


def _fraction(value: Decimal, where: str) -> bytes:
    """A JSON number with a fraction or an exponent: decimal if its digits fit, else double."""
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)  # json never produces NaN or infinities here
    mantissa = int("".join(map(str, digits)) or "0") * (-1 if sign else 1)
    scale = -exponent
    while scale < 0 and mantissa in _DECIMAL_MANTISSA:
        mantissa, scale = mantissa * 10, scale + 1  # 15E+2 -> 1500, scale 0
    if 0 <= scale <= 255 and mantissa in _DECIMAL_MANTISSA and not (sign and mantissa == 0):
        return b"D" + struct.pack(">Bi", scale, mantissa)
    double = float(value)
    try:
        exact = math.isfinite(double) and Decimal(repr(double)) == value
    except InvalidOperation:
        exact = False
    if not exact:
        raise Unpublishable(
            f"header {_shown(where)}: the number {_number(value)} fits neither an AMQP decimal "
            "(32-bit mantissa) nor a double without changing its value"
        )
    return b"d" + struct.pack(">d", double)


def _sized(data: bytes, what: str) -> bytes:
    if len(data) > LONG_STRING_MAX:
        raise Unpublishable(f"{what} is {len(data)} bytes; AMQP allows at most {LONG_STRING_MAX}")
    return struct.pack(">I", len(data)) + data


def _shown(where: str) -> str:
    """A header path as a reason shows it: quoted, and cut if very long."""
    return repr(where if len(where) <= 60 else where[:57] + "...")


def _number(value: int | Decimal) -> str:
    text = str(value)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"
