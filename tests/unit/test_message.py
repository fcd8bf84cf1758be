"""relay.message: every row becomes its exact AMQP message, or a reason naming column and limit."""

from __future__ import annotations

import json
import struct
from datetime import UTC, datetime
from decimal import Decimal

import pika
import pytest
from cloudevents.core.bindings.rabbitmq import RabbitMQMessage, from_binary
from cloudevents.core.formats.json import JSONFormat

from relay.message import MAX_HEADER_DEPTH, Limits, Unpublishable, build, encode_headers
from tests.support.rows import row

CREATED = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp())


def pika_decoded(properties: bytes) -> pika.BasicProperties:
    decoded = pika.BasicProperties()
    decoded.decode(properties)
    return decoded


def test_properties_are_byte_for_byte_what_pika_encodes_where_pika_can() -> None:
    headers = {
        "s": "x",
        "i": -5,
        "big": 2**40,
        "t": True,
        "v": None,
        "a": [1, "y", {"z": False}],
        "f": {"g": {"h": "k"}},
        "money": 19.99,
        "half": 0.5,
        "utf": "größe ✓",
    }
    ours = build(row(1, headers=json.dumps(headers))).properties
    as_pika = {**headers, "money": Decimal("19.99"), "half": Decimal("0.5")}
    theirs = pika.BasicProperties(
        content_type="text/plain",
        delivery_mode=2,
        message_id="m-1",
        timestamp=CREATED,
        headers=as_pika,
    )
    assert ours == b"".join(theirs.encode())
    decoded = pika_decoded(ours)
    assert (decoded.content_type, decoded.delivery_mode, decoded.message_id, decoded.timestamp) == (
        "text/plain",
        2,
        "m-1",
        CREATED,
    )
    assert decoded.headers == as_pika


def test_no_headers_means_no_header_table() -> None:
    decoded = pika_decoded(build(row(1)).properties)
    assert decoded.headers is None and decoded.message_id == "m-1"


def field(value_json: str) -> bytes:
    """The encoded field value of header "k" = ``value_json`` (after the table's length and key)."""
    return encode_headers('{"k": ' + value_json + "}")[4 + 2 :]


# JSON value -> the exact AMQP field value it becomes (type letter and big-endian bytes).
MAPPING = {
    '"text"': b"S" + struct.pack(">I", 4) + b"text",
    '"\\u00e9"': b"S" + struct.pack(">I", 2) + "é".encode(),
    "true": b"t\x01",
    "false": b"t\x00",
    "null": b"V",
    "0": b"I" + struct.pack(">i", 0),
    "-2147483648": b"I" + struct.pack(">i", -(2**31)),
    "2147483648": b"l" + struct.pack(">q", 2**31),
    "-9223372036854775808": b"l" + struct.pack(">q", -(2**63)),
    "9223372036854775807": b"l" + struct.pack(">q", 2**63 - 1),
    "19.99": b"D" + struct.pack(">Bi", 2, 1999),
    "0.5": b"D" + struct.pack(">Bi", 1, 5),
    "-1.25": b"D" + struct.pack(">Bi", 2, -125),
    "15e2": b"D" + struct.pack(">Bi", 0, 1500),
    "1.0": b"D" + struct.pack(">Bi", 1, 10),
    "0.30000000000000004": b"d" + struct.pack(">d", 0.30000000000000004),
    "3.141592653589793": b"d" + struct.pack(">d", 3.141592653589793),
    "1.5e10": b"d" + struct.pack(">d", 1.5e10),
    "1e-300": b"d" + struct.pack(">d", 1e-300),
    "-0.0": b"d" + struct.pack(">d", -0.0),
    "[]": b"A" + struct.pack(">I", 0),
    '[1, "a"]': b"A" + struct.pack(">I", 11) + b"I\x00\x00\x00\x01S\x00\x00\x00\x01a",
    "{}": b"F" + struct.pack(">I", 0),
    '{"a": null}': b"F" + struct.pack(">I", 3) + b"\x01aV",
}


@pytest.mark.parametrize(("value", "encoded"), MAPPING.items(), ids=list(MAPPING))
def test_every_json_value_has_one_exact_amqp_field(value: str, encoded: bytes) -> None:
    assert field(value) == encoded


def nested(depth: int) -> str:
    """Headers of ``depth`` tables, one inside the other."""
    return '{"a": ' * (depth - 1) + "{}" + "}" * (depth - 1)


LONG = "x" * 256
# Row fields -> the reason it can never be published (a part of it).
DEEP_ARRAYS = '{"a": ' + "[" * MAX_HEADER_DEPTH + "]" * MAX_HEADER_DEPTH + "}"
# Row fields -> the reason it can never be published (a part of it).
UNPUBLISHABLE = {
    "routing key too long": ({"routing_key": LONG}, "is 256 bytes; AMQP allows at most 255"),
    "exchange too long": ({"exchange": LONG}, "exchange is 256 bytes; AMQP allows at"),
    "message id too long": ({"message_id": LONG}, "message_id is 256 bytes"),
    "content type too long": ({"content_type": LONG}, "content_type is 256 bytes"),
    "characters count as bytes": ({"routing_key": "é" * 128}, "routing_key is 256 bytes"),
    "header key too long": ({"headers": json.dumps({LONG: 1})}, "header key 'xxxx"),
    "nested key too long": ({"headers": json.dumps({"a": {LONG: 1}})}, "header key 'a.xxx"),
    "headers not JSON": ({"headers": "not json"}, "headers are not valid JSON"),
    "headers not an object": ({"headers": "[1, 2]"}, "headers must be a JSON object"),
    "NaN is not JSON": ({"headers": '{"x": NaN}'}, "NaN is not a JSON number"),
    "Infinity is not JSON": ({"headers": '{"x": -Infinity}'}, "-Infinity is not a JSON number"),
    "nested too deep": ({"headers": nested(MAX_HEADER_DEPTH + 1)}, "nested deeper than 32"),
    "arrays count as depth": ({"headers": DEEP_ARRAYS}, "nested deeper than 32"),
    "deeper than JSON reads": ({"headers": nested(200_000)}, "nested deeper than 32"),
    "integer beyond 64 bits": ({"headers": '{"n": 9223372036854775808}'}, "'n': the integer"),
    "number beyond a double": ({"headers": '{"n": 1e400}'}, "'n': the number 1E+400 fits neither"),
    "more digits than a double": (
        {"headers": '{"n": 0.1000000000000000055511151231257827}'},
        "fits neither an AMQP decimal (32-bit mantissa) nor a double",
    ),
    "created before 1970": (
        {"created_at": datetime(1960, 1, 1, tzinfo=UTC)},
        "created_at 1960-01-01T00:00:00+00:00 is before 1970",
    ),
    "unreadable as stored": (
        {"unreadable": "unreadable row: payload is an INTEGER"},
        "unreadable row: payload is an INTEGER",
    ),
}


@pytest.mark.parametrize(("fields", "reason"), UNPUBLISHABLE.values(), ids=list(UNPUBLISHABLE))
def test_a_row_that_can_never_be_published_says_which_column_and_limit(
    fields: dict[str, object], reason: str
) -> None:
    with pytest.raises(Unpublishable) as raised:
        build(row(1, **fields))
    assert reason in str(raised.value)


def test_limits_at_the_edge_are_allowed() -> None:
    edge = "x" * 255
    fields = {"routing_key": edge, "exchange": edge, "message_id": edge, "content_type": edge}
    message = build(row(1, headers=json.dumps({edge: 1}), **fields))
    assert (message.exchange, message.routing_key) == (edge, edge)
    assert pika_decoded(message.properties).headers == {edge: 1}
    build(row(1, headers=nested(MAX_HEADER_DEPTH)))


def test_limits_the_broker_has_shown_are_applied() -> None:
    big = row(1, payload=b"x" * 1001)
    assert build(big, Limits(max_message_size=1001)).body == big.payload
    with pytest.raises(Unpublishable, match="1001 bytes, larger than configured max size 1000"):
        build(big, Limits(max_message_size=1000))
    headers = json.dumps({"h": "y" * 5000})
    build(row(1, headers=headers), Limits(frame_max=8192))
    with pytest.raises(Unpublishable, match=r"must fit one frame \(frame_max 4096"):
        build(row(1, headers=headers), Limits(frame_max=4096))


@pytest.mark.parametrize(
    ("stored", "published"),
    [
        (None, {"traceparent": "relay's"}),
        ('{"a": 1}', {"a": 1, "traceparent": "relay's"}),
        ('{"traceparent": "writer\'s", "a": 1}', {"traceparent": "relay's", "a": 1}),
    ],
)
def test_the_relays_trace_headers_replace_the_rows_own(
    stored: str | None, published: dict[str, object]
) -> None:
    message = build(row(1, headers=stored), trace={"traceparent": "relay's"})
    assert pika_decoded(message.properties).headers == published


CE = {"ce-id": "m-1", "ce-specversion": "1.0", "ce-time": "2026-01-01T00:00:00.250000Z"}
# (the row's routing key, its stored headers) -> the published headers, or a part of why not
CLOUDEVENTS = {
    "source from the setting, type from the routing key": (
        ("order.paid", None),
        {"ce-source": "/shop", "ce-type": "order.paid", **CE},
    ),
    "the row's own source and type win": (
        ("order.paid", '{"ce-source": "/billing", "ce-type": "com.shop.paid", "a": 1}'),
        {"ce-source": "/billing", "ce-type": "com.shop.paid", "a": 1, **CE},
    ),
    "the row may repeat its ce-id and the spec version": (
        ("k", '{"ce-id": "m-1", "ce-specversion": "1.0"}'),
        {"ce-source": "/shop", "ce-type": "k", **CE},
    ),
    "the row's own time wins": (
        ("k", '{"ce-time": "2025-12-31T23:00:00+01:00"}'),
        {"ce-source": "/shop", "ce-type": "k", **CE, "ce-time": "2025-12-31T23:00:00+01:00"},
    ),
    "attribute headers in any case are attributes, written lower-cased": (
        ("k", '{"CE-Source": "/billing", "ce-Subject": "order-7", "ce-traceid": "t"}'),
        {"ce-source": "/billing", "ce-subject": "order-7", "ce-traceid": "t", "ce-type": "k", **CE},
    ),
    "no routing key and no ce-type: unpublishable": (("", None), "needs a ce-type"),
    "a ce-source that is not text: unpublishable": (
        ("k", '{"ce-source": 7}'),
        "is text, not empty",
    ),
    "another ce-id: unpublishable": (("k", '{"ce-id": "other"}'), "id is the row's message_id"),
    "a time that is not RFC 3339: unpublishable": (("k", '{"ce-time": "then"}'), "RFC 3339"),
    "a time without its offset: unpublishable": (
        ("k", '{"ce-time": "2026-01-01T00:00:00"}'),
        "RFC 3339",
    ),
    "another spec version: unpublishable": (("k", '{"ce-specversion": "0.3"}'), "not '0.3'"),
    "an attribute name that is not lower-case letters and digits: unpublishable": (
        ("k", '{"ce-order_id": 7}'),
        "lower-case letters and digits",
    ),
    "an empty subject: unpublishable": (("k", '{"ce-subject": ""}'), "subject is text, not"),
    "a data content type of the row's: unpublishable": (
        ("k", '{"ce-datacontenttype": "a/b"}'),
        "set that instead",
    ),
    "the reserved data attribute: unpublishable": (("k", '{"ce-data": 1}'), "reserved"),
    "a control character in an attribute: unpublishable": (
        ("k", '{"ce-subject": "order\\u0000"}'),
        "'ce-subject' holds the control character U\\+0000",
    ),
    "a control character in an extension: unpublishable": (
        ("k", '{"ce-tenant": "a\\u009fb"}'),
        "'ce-tenant' holds the control character U\\+009F",
    ),
    "a control character in the routing key, the type: unpublishable": (
        ("k\x7f", None),
        "'ce-type' holds the control character U\\+007F",
    ),
    "spaces and text beyond Latin-1 are text": (
        ("k", '{"ce-subject": " order 7 ", "ce-tenant": "caf\u00e9 \u2603"}'),
        {
            "ce-source": "/shop",
            "ce-subject": " order 7 ",
            "ce-tenant": "caf\u00e9 \u2603",
            "ce-type": "k",
            **CE,
        },
    ),
    "two headers of one attribute: unpublishable": (
        ("k", '{"ce-source": "/a", "CE-SOURCE": "/b"}'),
        "name one CloudEvents attribute",
    ),
}


@pytest.mark.parametrize(("given", "expected"), CLOUDEVENTS.values(), ids=list(CLOUDEVENTS))
def test_a_cloudevent_carries_its_attributes_as_ce_headers(
    given: tuple[str, str | None], expected: dict[str, object] | str
) -> None:
    routing_key, headers = given
    created = datetime(2026, 1, 1, 0, 0, 0, 250000, tzinfo=UTC)
    stored = row(1, routing_key=routing_key, headers=headers, created_at=created)
    if isinstance(expected, str):
        with pytest.raises(Unpublishable, match=expected):
            build(stored, cloudevents_source="/shop")
        return
    decoded = pika_decoded(build(stored, cloudevents_source="/shop").properties)
    assert decoded.headers == expected
    assert decoded.content_type == "text/plain"  # the data's content type


@pytest.mark.parametrize(("given", "expected"), CLOUDEVENTS.values(), ids=list(CLOUDEVENTS))
def test_every_cloudevent_the_relay_publishes_the_sdk_reads(
    given: tuple[str, str | None], expected: dict[str, object] | str
) -> None:
    """The CloudEvents SDK's RabbitMQ binding reads each message the relay builds; the rows
    it would refuse are the ones parked (an empty content type among them)."""
    routing_key, headers = given
    for content_type in ("text/plain", ""):
        stored = row(1, routing_key=routing_key, headers=headers, content_type=content_type)
        try:
            message = build(stored, cloudevents_source="/shop")
        except Unpublishable:
            assert isinstance(expected, str) or content_type == ""
            continue
        decoded = pika_decoded(message.properties)
        event = from_binary(
            RabbitMQMessage(decoded.headers, decoded.content_type, message.body), JSONFormat()
        )
        assert event.get_id() == "m-1" and event.get_type() == decoded.headers["ce-type"]


def test_a_cloudevent_of_an_empty_message_id_is_unpublishable_naming_the_column() -> None:
    """ce-id is the message id: an empty one went out as ``ce-id: ""``, which the SDK's
    reader refuses ("Attribute 'id' must not be None or empty"). Without CloudEvents an
    empty message id is the row's to send."""
    stored = row(1, message_id="")
    with pytest.raises(Unpublishable, match=r"CloudEvent's id \(the row's message_id\)"):
        build(stored, cloudevents_source="/shop")
    assert pika_decoded(build(stored).properties).message_id == ""


@pytest.mark.parametrize(
    ("column", "value", "named"),
    [
        ("message_id", "m-\x001", "'message_id' holds the control character U\\+0000"),
        ("content_type", "text/plain\n", "'content_type' holds the control character U\\+000A"),
    ],
)
def test_a_cloudevent_of_a_column_with_a_control_character_is_unpublishable_naming_it(
    column: str, value: str, named: str
) -> None:
    """CloudEvents' strings exclude the control characters; without CloudEvents the row's
    message id and content type go as AMQP carries them."""
    stored = row(1, **{column: value})
    with pytest.raises(Unpublishable, match=named):
        build(stored, cloudevents_source="/shop")
    assert getattr(pika_decoded(build(stored).properties), column) == value


def test_trace_headers_go_with_a_cloudevents_attributes() -> None:
    message = build(row(1), trace={"traceparent": "relay's"}, cloudevents_source="/shop")
    headers = pika_decoded(message.properties).headers
    assert headers["traceparent"] == "relay's" and headers["ce-id"] == "m-1"
