"""What an inbox consumer decides without I/O: whether a delivery can be keyed, what a failed
attempt leads to, and whether the dedupe window outlasts the relay's memory of a message."""

from __future__ import annotations

from relay.records import Delivery, Verdict

# The inbox keeps ids as AMQP short strings (``relay.db.schema.inbox_received``).
KEY_MAX_BYTES = 255


def key_problem(delivery: Delivery) -> str | None:
    """Why the inbox cannot remember ``delivery`` (and so dead-letters it), or None."""
    key = delivery.key
    if key is None:
        return "the message has neither a message_id nor a ce-id header: it cannot be deduplicated"
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > KEY_MAX_BYTES:
        return f"its ce-id is {size} bytes; the inbox keeps ids of at most {KEY_MAX_BYTES}"
    return None


def after_failure(attempts: int, max_attempts: int) -> Verdict:
    """A failed attempt, the ``attempts``-th counted: delivered again, or dead-lettered when
    it was the last one allowed."""
    return Verdict.RETRY if attempts < max_attempts else Verdict.DEAD_LETTER


def too_many_before(attempts: int, max_attempts: int) -> bool:
    """A delivery that comes again with ``attempts`` counted, this one among them, is
    dead-lettered unhandled: its earlier attempts used up the allowance (a handler that kills
    its consumer is never seen to fail, only to come back)."""
    return attempts > max_attempts


def window_problem(window: float, retention: float) -> str | None:
    """Why a dedupe window of ``window`` seconds lets a message the relay can still send
    again be processed twice, or None (0: forever, for both)."""
    if window == 0:
        return None
    if retention == 0:
        return (
            f"RELAY_INBOX_DEDUPE_WINDOW={window:g} s, while the relay keeps sent messages "
            "forever (RELAY_RETENTION=0): a message replayed after the window is processed again"
        )
    if window <= retention:
        return (
            f"RELAY_INBOX_DEDUPE_WINDOW={window:g} s is not longer than the relay's "
            f"RELAY_RETENTION={retention:g} s: a message replayed (relay replay --sent) or "
            "written again after the window is processed again"
        )
    return None
