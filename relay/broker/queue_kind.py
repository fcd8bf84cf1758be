"""What kind of queue a queue is, as far as reading it goes: whether its messages can be read
and put back (``basic.get`` unacknowledged, then a requeue) without any being dropped or
reordered. Only a classic queue without a delivery limit can: a quorum queue counts each
read as a delivery (at its delivery limit, 20 by default on RabbitMQ 4, the broker drops the
message) and may put returned messages behind others; a stream cannot be read so at all.

AMQP has no way to ask a queue's type or arguments. A declare with arguments that differ
from the queue's is refused with a reply naming the first that differs and its value
(``inequivalent arg 'x-queue-type' ... current is 'quorum'``): the queue is declared as a
durable classic queue, each refusal's argument taken into the next declare, until one is
accepted (the queue is classic with exactly those arguments) or refused on its type or a
delivery limit. A declare that is accepted changes nothing (the queue is there, as
declared); each refusal closes its channel only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pika
import pika.exceptions

_PRECONDITION_FAILED = 406
# At most this many declares: one per argument the queue was declared with (a handful).
_PROBES = 12
_INEQUIVALENT = re.compile(r"inequivalent arg '([^']+)'")
_CURRENT_TYPE = re.compile(r"current is '([^']*)'")
_CURRENT_VALUE = re.compile(r"received none but current is the value '(.*)' of type '(\w+)'$")
_INTEGERS = ("signedint", "long", "short", "byte", "unsignedbyte", "unsignedshort", "unsignedint")
QUEUE_TYPE = "x-queue-type"
DELIVERY_LIMIT = "x-delivery-limit"


@dataclass(frozen=True, slots=True)
class Refusal:
    """What a refused declare says to do next: declare again with ``arguments`` (or the
    other durability), or stop because the queue cannot be read (``unreadable``)."""

    unreadable: str = ""
    flip_durable: bool = False
    argument: tuple[str, Any] | None = None


def refusal(reply_text: str) -> Refusal:
    """Pure: what a declare's ``PRECONDITION_FAILED`` reply says of the queue."""
    found = _INEQUIVALENT.search(reply_text)
    if found is None:
        return Refusal(unreadable=f"its arguments could not be learnt ({reply_text})")
    name = found[1]
    if name == "durable":
        return Refusal(flip_durable=True)
    if name == QUEUE_TYPE:
        current = _CURRENT_TYPE.search(reply_text)
        return Refusal(unreadable=f"it is a {current[1] if current else 'non-classic'} queue")
    if name == DELIVERY_LIMIT:
        return Refusal(unreadable="it has a delivery limit")
    value = _CURRENT_VALUE.search(reply_text)
    if value is None:
        return Refusal(unreadable=f"its argument {name} could not be learnt")
    text, kind = value[1], value[2]
    if kind in _INTEGERS:
        return Refusal(argument=(name, int(text)))
    if kind in ("longstr", "shortstr"):
        return Refusal(argument=(name, text))
    if kind == "bool":
        return Refusal(argument=(name, text == "true"))
    return Refusal(unreadable=f"its argument {name} is a {kind}")


def unreadable(connection: pika.BlockingConnection, queue: str) -> str:
    """Why ``queue`` (which exists) cannot be read without dropping or reordering a
    message, or "" when it can (a classic queue without a delivery limit)."""
    durable = True
    arguments: dict[str, Any] = {QUEUE_TYPE: "classic"}
    for _ in range(_PROBES):
        channel = connection.channel()
        try:
            channel.queue_declare(queue, durable=durable, arguments=arguments)
        except pika.exceptions.ChannelClosedByBroker as exc:
            if exc.reply_code != _PRECONDITION_FAILED:
                return f"it could not be declared ({exc.reply_code} {exc.reply_text})"
            said = refusal(exc.reply_text)
            if said.unreadable:
                return said.unreadable
            if said.flip_durable:
                durable = not durable
            if said.argument is not None:
                arguments[said.argument[0]] = said.argument[1]
            continue
        channel.close()
        return ""
    return "its arguments could not be learnt"
