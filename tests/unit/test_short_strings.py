"""AMQP short strings under aio-pika (``relay.broker.aio_consumer``), table-driven: bytes that
are not UTF-8 arrive whole, as ``Undecodable``, and are written back as the same bytes."""

from __future__ import annotations

import pytest
from pamqp import decode, encode

from relay.broker.aio_consumer import Undecodable, tolerate_bytes_in_short_strings

# the bytes on the wire -> whether they are UTF-8
WIRE = {
    "text": (b"order-1", True),
    "empty": (b"", True),
    "UTF-8 beyond ASCII": ("m-é-日本".encode(), True),
    "a byte that is not UTF-8": (b"\xffm-1", False),
    "a truncated sequence": (b"m-\xc3", False),
    "a surrogate encoded": (b"\xed\xa0\x80", False),
    "255 bytes of Latin-1": (bytes(range(1, 256)), False),
}


@pytest.mark.parametrize("name", WIRE, ids=list(WIRE))
def test_a_short_string_comes_and_goes_back_as_its_bytes(name: str) -> None:
    raw, utf8 = WIRE[name]
    tolerate_bytes_in_short_strings()
    consumed, value = decode.by_type(bytes([len(raw)]) + raw + b"rest", "shortstr")
    assert consumed == len(raw) + 1
    assert isinstance(value, str)
    assert isinstance(value, Undecodable) is not utf8
    if not utf8:
        assert isinstance(value, Undecodable) and value.raw == raw
        assert str(value) is value, "aio-pika's str() of a property keeps it"
    assert encode.by_type(value, "shortstr") == bytes([len(raw)]) + raw


def test_a_short_string_over_255_bytes_is_refused() -> None:
    tolerate_bytes_in_short_strings()
    with pytest.raises(TypeError, match="255 bytes"):
        encode.by_type("é" * 128, "shortstr")
