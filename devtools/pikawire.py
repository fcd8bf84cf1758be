"""What pika's own ``basic_publish`` writes for a message, without a socket: the reference the
relay's frame encoding (``relay.broker.frames``) is held to, by its tests and its bench."""

from __future__ import annotations

import pika
import pika.channel
import pika.connection

from relay.message import Message


class _Written:
    """The part of a pika connection that a channel's publish runs through: pika's own
    methods, writing to a list instead of a socket."""

    _send_method = pika.connection.Connection._send_method
    _send_message = pika.connection.Connection._send_message
    _output_marshaled_frames = pika.connection.Connection._output_marshaled_frames

    def __init__(self, frame_max: int) -> None:
        self.callbacks = None
        self.is_closed = False
        self.bytes_sent = self.frames_sent = 0
        # As pika's connection sets it when the frame size is negotiated.
        self._body_max_length = frame_max - 8
        self.written: list[bytes] = []

    def _adapter_emit_data(self, data: bytes) -> None:
        self.written.append(data)


class EncodedProperties(pika.BasicProperties):  # type: ignore[misc]
    """Properties encoded by ``relay.message``, as the relay handed them to ``basic_publish``
    before it encoded its frames itself (pika asks a content header's properties only for
    ``encode()``)."""

    def __init__(self, encoded: bytes) -> None:
        super().__init__()
        self._encoded = encoded

    def encode(self) -> list[bytes]:
        return [self._encoded]


class PikaWire:
    """A channel ``channel`` of a connection that negotiated ``frame_max``, open."""

    def __init__(self, channel: int, frame_max: int) -> None:
        self._connection = _Written(frame_max)
        self._channel = pika.channel.Channel(self._connection, channel, lambda _ch: None)
        self._channel._state = pika.channel.Channel.OPEN

    def publish(self, message: Message, *, mandatory: bool = True) -> bytes:
        """What ``basic_publish`` writes for ``message``, as the relay called it."""
        self._channel.basic_publish(
            message.exchange,
            message.routing_key,
            memoryview(message.body),
            EncodedProperties(message.properties),
            mandatory=mandatory,
        )
        written, self._connection.written = self._connection.written, []
        return b"".join(written)
