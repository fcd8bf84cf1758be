"""A message's identity: its ``message_id`` as a function of values alone. Pure: no I/O.

Writers that may run twice (a Spark task retried, a job re-run, a stream's micro-batch
replayed) derive each message's id from what identifies the message, so that the second
write inserts nothing: the outbox's ``message_id`` is unique.

The id is ``prefix + sha256(encoding).hexdigest()``; the encoding of a sequence of values is
the concatenation of each value's encoding, and each value's encoding is self-delimiting
(a type tag, then a fixed width or a length prefix), so two different sequences never share
an encoding: separators inside strings, nulls against strings, ``1`` against ``"1"``, a
value split across two columns all encode differently. Values compare as Spark compares
them when it groups rows, which is what makes the occurrence numbers of identical rows
(``relay.spark``) well defined:

===========================  ==================================================================
value                        encoding
===========================  ==================================================================
null                         ``n``
boolean                      ``b`` + one byte 0/1
integer (any width)          ``i`` + length + decimal digits
float (32 or 64 bit)         ``f`` + the 8 bytes of the double; ``-0.0`` as ``0.0``, one NaN
decimal                      ``d`` + length + ``<coefficient>e<exponent>`` in decimal digits,
                             exact at any precision, trailing zeros moved into the exponent
                             (``1.10`` and ``1.1`` as ``11e-1``, ``100`` as ``1e2``, zero as
                             ``0e0``); ``NaN``, ``Infinity``, ``-Infinity``
string                       ``s`` + length + UTF-8
binary                       ``y`` + length + bytes
timestamp (with time zone)   ``t`` + microseconds since 1970-01-01 UTC (8 bytes): the instant,
                             whatever the session's time zone
timestamp without time zone  ``l`` + microseconds of the wall-clock value since 1970-01-01
date                         ``D`` + days since 1970-01-01 (8 bytes)
time of day                  ``h`` + microseconds since midnight (8 bytes)
interval                     ``x`` + microseconds (8 bytes)
array                        ``a`` + count + each element
struct                       ``r`` + count + each field's name (as a string) and value
map                          ``m`` + count + each key and value, in the map's order
===========================  ==================================================================

Lengths and counts are 8-byte big-endian unsigned integers; the other 8-byte values signed.
The encoding is versioned by ``IDENTITY_VERSION``, which is the first value of every id's
sequence: ids stay stable across releases of this package and of Spark, until the version
changes. Version 1 wrote a decimal as ``str(value.normalize())``, which rounds to 28
significant digits: two ``decimal(38, 0)`` values that differ past the 28th digit shared an
id, and the second message was taken for a re-run of the first and dropped. Version 2 is
exact.
"""

from __future__ import annotations

import hashlib
import math
import struct
from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

IDENTITY_VERSION = "outbox-identity/2"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_EPOCH_NAIVE = datetime(1970, 1, 1)
_EPOCH_DAY = date(1970, 1, 1).toordinal()
_U64 = struct.Struct(">Q")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")
_CANONICAL_NAN = _F64.pack(math.nan)


class Unidentifiable(TypeError):
    """A value of a type the identity has no encoding for."""


def message_id(values: Iterable[Any], prefix: str = "") -> str:
    """The id of the message identified by ``values`` (in order)."""
    return message_ids([b"".join(map(encode, values))], prefix)[0]


def message_ids(encodings: Iterable[bytes], prefix: str = "") -> list[str]:
    """The ids of the messages whose values encode (``encode``, concatenated) to each of
    ``encodings``: ``message_id`` with the encoding done beforehand (``relay.spark.encodings``
    does it a column at a time)."""
    ids = []
    for encoding in encodings:
        digest = _VERSIONED.copy()
        digest.update(encoding)
        ids.append(prefix + digest.hexdigest())
    return ids


def encode(value: Any) -> bytes:
    """``value``'s self-delimiting encoding (the module docstring's table)."""
    if value is None:
        return b"n"
    # bool before int: a bool is an int in Python.
    if isinstance(value, bool):
        return b"b\x01" if value else b"b\x00"
    if isinstance(value, int):
        return _sized(b"i", str(value).encode())
    if isinstance(value, float):
        if math.isnan(value):
            return b"f" + _CANONICAL_NAN
        return b"f" + _F64.pack(value + 0.0)  # -0.0 + 0.0 is 0.0
    if isinstance(value, Decimal):
        return _sized(b"d", _decimal(value).encode())
    if isinstance(value, str):
        return _sized(b"s", value.encode("utf-8", "surrogatepass"))
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _sized(b"y", bytes(value))
    # datetime before date: a datetime is a date in Python.
    if isinstance(value, datetime):
        if value.tzinfo is None:
            return b"l" + _I64.pack(_micros(value - _EPOCH_NAIVE))
        return b"t" + _I64.pack(_micros(value - _EPOCH))
    if isinstance(value, date):
        return b"D" + _I64.pack(value.toordinal() - _EPOCH_DAY)
    if isinstance(value, time):
        since_midnight = datetime.combine(date.min, value.replace(tzinfo=None))
        return b"h" + _I64.pack(_micros(since_midnight - datetime.min))
    if isinstance(value, timedelta):
        micros = _micros(value)
        if not -(2**63) <= micros < 2**63:  # Spark's intervals fit; Python's go further
            raise Unidentifiable(f"an interval of {value} is beyond 64-bit microseconds")
        return b"x" + _I64.pack(micros)
    if isinstance(value, Mapping):
        # A struct (Arrow gives a struct as a dict): field names count, in the schema's order.
        return _items(b"r", [part for kv in value.items() for part in kv], len(value))
    if isinstance(value, list):
        # Arrow gives a map as a list of (key, value) tuples: a list of pairs is a map.
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return _items(b"m", [part for kv in value for part in kv], len(value))
        return _items(b"a", value, len(value))
    raise Unidentifiable(f"no identity encoding for a value of type {type(value).__name__}")


def _sized(tag: bytes, data: bytes) -> bytes:
    return tag + _U64.pack(len(data)) + data


def _items(tag: bytes, parts: list[Any], count: int) -> bytes:
    return tag + _U64.pack(count) + b"".join(encode(p) for p in parts)


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def _decimal(value: Decimal) -> str:
    """Exact: from the decimal's own digits, never through a context's precision."""
    if value.is_nan():
        return "NaN"  # one NaN, as for floats
    if value.is_infinite():
        return "-Infinity" if value.is_signed() else "Infinity"
    sign, digits, exponent = value.as_tuple()
    assert isinstance(exponent, int)
    coefficient = int("".join(map(str, digits)))
    if coefficient == 0:
        return "0e0"  # -0 and 0E-5 are 0
    while coefficient % 10 == 0:
        coefficient //= 10
        exponent += 1
    return f"{'-' if sign else ''}{coefficient}e{exponent}"


# Every id's hash starts from the version: hashed once, copied per id.
_VERSIONED = hashlib.sha256(encode(IDENTITY_VERSION))
