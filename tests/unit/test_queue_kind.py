"""What a refused declare says of a queue (``relay.broker.queue_kind.refusal``), and when a
page of dead letters says it may be partial."""

from __future__ import annotations

import pytest

from relay.broker.deadletter_pages import LetterPage
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


@pytest.mark.parametrize(
    "missed, depth, after, partial",
    [(0, 4, 4, False), (2, 4, 2, True), (0, 2, 4, True), (0, 0, 0, False), (0, 3, 0, False)],
)
def test_a_page_is_partial_when_its_read_missed_letters_or_more_came_back(
    missed: int, depth: int, after: int, partial: bool
) -> None:
    assert LetterPage([], depth, missed=missed, depth_after=after).partial is partial
    assert not LetterPage([], depth, unreadable="it is a quorum queue").partial
