"""relay.broker.frames: a publish's frames are byte for byte what pika's ``basic_publish`` writes,
for every property and header type the relay sends, every body size and frame size."""

from __future__ import annotations

import json
from typing import Any

import pytest

from devtools.pikawire import PikaWire
from relay.broker.frames import FRAME_MIN_SIZE, PublishFrames
from relay.constants import METHOD_FRAMES_KEPT
from relay.message import Limits, Message, build
from tests.support.rows import row

FRAME_MAX = 131072  # RabbitMQ's default, as negotiated


def pikas(message: Message, *, channel: int, frame_max: int, mandatory: bool = True) -> bytes:
    """What ``basic_publish`` writes for ``message``."""
    return PikaWire(channel, frame_max).publish(message, mandatory=mandatory)


def ours(message: Message, *, channel: int, frame_max: int, mandatory: bool = True) -> bytes:
    return PublishFrames().encode(channel, message, mandatory=mandatory, frame_max=frame_max)


EVERY_HEADER_TYPE = {
    "s": "x",
    "i": -5,
    "big": 2**40,
    "negative big": -(2**40),
    "t": True,
    "v": None,
    "a": [1, "y", {"z": False}],
    "f": {"g": {"h": "k"}},
    "decimal": 19.99,
    "double": 0.30000000000000004,
    "utf": "größe ✓",
}

# name: (the row's fields, the message's build arguments)
MESSAGES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "no headers": ({}, {}),
    "every header type": ({"headers": json.dumps(EVERY_HEADER_TYPE)}, {}),
    "trace context": ({"headers": '{"a": 1}'}, {"trace": {"traceparent": "00-" + "1" * 32}}),
    "cloudevent": ({"headers": '{"ce-type": "t"}'}, {"cloudevents_source": "/here"}),
    "empty body": ({"payload": b""}, {}),
    "default exchange": ({"exchange": "", "routing_key": "queue"}, {}),
    "utf-8 names": ({"exchange": "bestellungen-ü", "routing_key": "größe.✓"}, {}),
    "255-byte names": ({"exchange": "e" * 255, "routing_key": "r" * 255}, {}),
    "one full frame": ({"payload": b"b" * (FRAME_MAX - 8)}, {}),
    "a byte over one frame": ({"payload": b"b" * (FRAME_MAX - 7)}, {}),
    "two and a half frames": ({"payload": bytes(range(256)) * 1280}, {}),
}


@pytest.mark.parametrize("name", MESSAGES)
@pytest.mark.parametrize("channel", [1, 65535])
def test_frames_are_what_basic_publish_writes(name: str, channel: int) -> None:
    fields, arguments = MESSAGES[name]
    message = build(row(1, **fields), Limits(frame_max=FRAME_MAX), **arguments)
    expected = pikas(message, channel=channel, frame_max=FRAME_MAX)
    assert ours(message, channel=channel, frame_max=FRAME_MAX) == expected


@pytest.mark.parametrize("frame_max", [FRAME_MIN_SIZE, 4097, 10_000])
@pytest.mark.parametrize("body_size", [0, 1, 4087, 4088, 4089, 30_000])
def test_body_frames_follow_the_negotiated_frame_max(frame_max: int, body_size: int) -> None:
    message = build(row(1, payload=b"\x07" * body_size))
    expected = pikas(message, channel=3, frame_max=frame_max)
    assert ours(message, channel=3, frame_max=frame_max) == expected


def test_mandatory_off_is_pikas_too() -> None:
    message = build(row(1))
    expected = pikas(message, channel=1, frame_max=FRAME_MAX, mandatory=False)
    assert ours(message, channel=1, frame_max=FRAME_MAX, mandatory=False) == expected


def test_method_frames_kept_are_per_channel_and_bounded() -> None:
    frames = PublishFrames()
    message = build(row(1))

    def encode(channel: int, routing_key: str) -> bytes:
        to = message._replace(routing_key=routing_key)
        return frames.encode(channel, to, mandatory=True, frame_max=FRAME_MAX)

    first = encode(1, "rk")
    assert encode(2, "rk") != first  # another channel's frame, not the one kept
    for n in range(METHOD_FRAMES_KEPT + 1):  # more destinations than are kept
        encode(1, f"rk-{n}")
    assert encode(1, "rk") == first


@pytest.mark.parametrize(
    ("exchange", "frame_max", "complaint"),
    [
        ("e" * 256, FRAME_MAX, "more than a short string's 255"),
        ("\ud800", FRAME_MAX, "surrogates not allowed"),
        ("ex", FRAME_MIN_SIZE - 1, "below AMQP's minimum 4096"),
    ],
)
def test_what_pika_refuses_is_refused(exchange: str, frame_max: int, complaint: str) -> None:
    with pytest.raises(ValueError, match=complaint):
        message = Message(exchange, "rk", b"", b"")
        PublishFrames().encode(1, message, mandatory=True, frame_max=frame_max)
