"""What a refused declare says of a queue (``relay.broker.queue_kind.refusal``), and when a
dead-letter listing says it is partial."""

from __future__ import annotations

import pytest

from relay.broker.deadletters import DeadLetter, Listing
from relay.broker.queue_kind import Refusal, refusal

_AT = "PRECONDITION_FAILED - inequivalent arg '{}' for queue 'q' in vhost '/': "


@pytest.mark.parametrize(
    "reply, said",
    [
        (
            _AT.format("x-queue-type") + "received 'classic' but current is 'quorum'",
            Refusal(unreadable="it is a quorum queue"),
        ),
        (
            _AT.format("x-queue-type") + "received 'classic' but current is 'stream'",
            Refusal(unreadable="it is a stream queue"),
        ),
        (
            _AT.format("x-delivery-limit")
            + "received none but current is the value '3' of type 'signedint'",
            Refusal(unreadable="it has a delivery limit"),
        ),
        (
            _AT.format("durable") + "received 'true' but current is 'false'",
            Refusal(flip_durable=True),
        ),
        (
            _AT.format("x-max-length")
            + "received none but current is the value '5' of type 'long'",
            Refusal(argument=("x-max-length", 5)),
        ),
        (
            _AT.format("x-dead-letter-exchange")
            + "received none but current is the value 'dlx' of type 'longstr'",
            Refusal(argument=("x-dead-letter-exchange", "dlx")),
        ),
        (
            _AT.format("x-max-length") + "received '5' but current is the value '6' of type 'long'",
            Refusal(unreadable="its argument x-max-length could not be learnt"),
        ),
        (
            _AT.format("x-thing") + "received none but current is the value '1.5' of type 'double'",
            Refusal(unreadable="its argument x-thing is a double"),
        ),
        (
            "NOT_ALLOWED - something else",
            Refusal(unreadable="its arguments could not be learnt (NOT_ALLOWED - something else)"),
        ),
    ],
)
def test_a_refused_declare_names_what_differs(reply: str, said: Refusal) -> None:
    assert refusal(reply) == said


def _letters(n: int) -> list[DeadLetter]:
    return [DeadLetter(str(i), str(i), "e", 1, "c", "q", "") for i in range(n)]


@pytest.mark.parametrize(
    "read, depth, after, partial",
    [(4, 4, 4, False), (2, 4, 2, True), (2, 2, 4, True), (0, 0, 0, False), (3, 3, 0, False)],
)
def test_a_listing_is_partial_when_fewer_letters_were_read_than_the_queue_held(
    read: int, depth: int, after: int, partial: bool
) -> None:
    assert Listing(_letters(read), depth, depth_after=after).partial is partial
    assert not Listing([], depth, unreadable="it is a quorum queue").partial
