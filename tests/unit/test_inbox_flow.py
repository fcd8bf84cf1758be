"""One delivery's way through the inbox (``relay.inbox.flow``), table-driven: the steps it
asks for, what each answers (or the StoreError it raises), and the verdict; no I/O, the
same decisions the blocking and the asyncio inboxes drive."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from relay.db.inbox import CRASHED, Failures, InboxStatements, Outcome, Ran, TransactionEnded
from relay.errors import StoreError
from relay.inbox import InboxSettings
from relay.inbox.flow import Call, Flow, Run, Step, drive, drive_async
from relay.metrics import InboxMetrics
from relay.records import Answer, Delivery, Verdict

DOWN = StoreError("the database is away")
AT = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
BROKE = ValueError("broke")


def delivery(message_id: str | bytes | None = "m-1", redelivered: bool = False) -> Delivery:
    return Delivery(message_id, b"{}", "x", "k", None, {}, redelivered)


def failures(attempts: int, error: str = "ValueError: broke") -> Failures:
    return Failures(attempts, error, AT, AT)


# name -> (the delivery, [(the step it asks, its answer or the error it raises)], the verdict,
# the delay, whether it pauses, the dead letter's attempts (or None))
CASES: dict[str, tuple[Delivery, list[tuple[str, Any]], Verdict, float, bool, int | None]] = {
    "a message without a key: dead-lettered, nothing asked": (
        delivery(None),
        [],
        Verdict.DEAD_LETTER,
        0.0,
        False,
        0,
    ),
    "a id that is not UTF-8: dead-lettered, nothing asked": (
        delivery(b"\xff"),
        [],
        Verdict.DEAD_LETTER,
        0.0,
        False,
        0,
    ),
    "processed: acked": (
        delivery(),
        [("run", Ran(Outcome.DONE, 0.01))],
        Verdict.ACK,
        0,
        False,
        None,
    ),
    "a duplicate: acked, the handler not run": (
        delivery(),
        [("run", Ran(Outcome.DUPLICATE))],
        Verdict.ACK,
        0.0,
        False,
        None,
    ),
    "the first failure: again at once": (
        delivery(),
        [("run", Ran(Outcome.FAILED, error=BROKE)), ("counting an attempt", 1)],
        Verdict.RETRY,
        0.0,
        False,
        None,
    ),
    "the second failure: again after the first delay": (
        delivery(redelivered=True),
        [
            ("marking a run", 1),
            ("run", Ran(Outcome.FAILED, error=BROKE)),
            ("counting an attempt", 2),
        ],
        Verdict.DELAY,
        5.0,
        False,
        None,
    ),
    "the last failure: dead-lettered with its failures": (
        delivery(redelivered=True),
        [
            ("marking a run", 4),
            ("run", Ran(Outcome.FAILED, error=BROKE)),
            ("counting an attempt", 5),
            ("reading attempts", failures(5)),
        ],
        Verdict.DEAD_LETTER,
        0.0,
        False,
        5,
    ),
    "runs that died used it up: dead-lettered before the handler": (
        delivery(redelivered=True),
        [("marking a run", 5), ("reading attempts", failures(5, CRASHED))],
        Verdict.DEAD_LETTER,
        0.0,
        False,
        5,
    ),
    "the database away in the run: requeued uncounted, paused, the run's mark ended": (
        delivery(redelivered=True),
        [("marking a run", 0), ("run", DOWN), ("ending a run", None)],
        Verdict.RETRY,
        0.0,
        True,
        None,
    ),
    "the database away at the mark: requeued uncounted, paused": (
        delivery(redelivered=True),
        [("marking a run", DOWN)],
        Verdict.RETRY,
        0.0,
        True,
        None,
    ),
    "the database away at the count: requeued uncounted, paused": (
        delivery(),
        [("run", Ran(Outcome.FAILED, error=BROKE)), ("counting an attempt", DOWN)],
        Verdict.RETRY,
        0.0,
        True,
        None,
    ),
    "the handler ended the transaction: its key forgotten, a failure": (
        delivery(),
        [
            ("run", Ran(Outcome.ENDED, error=TransactionEnded("ended"))),
            ("forgetting a key", None),
            ("counting an attempt", 1),
        ],
        Verdict.RETRY,
        0.0,
        False,
        None,
    ),
    "the failures unread: dead-lettered with the reason alone": (
        delivery(),
        [
            ("run", Ran(Outcome.FAILED, error=BROKE)),
            ("counting an attempt", 5),
            ("reading attempts", DOWN),
        ],
        Verdict.DEAD_LETTER,
        0.0,
        False,
        0,
    ),
}


def flow() -> Flow:
    settings = InboxSettings.load({}, {"inbox_queue": "q"})
    statements = InboxStatements(sa.create_engine("sqlite://").dialect, "q")
    return Flow(settings, statements, InboxMetrics("q"))


def scripted(script: list[tuple[str, Any]]) -> tuple[Callable[[Step], Any], list[str]]:
    """A ``do`` that answers each step from ``script`` in turn; and the steps it was asked."""
    asked: list[str] = []
    answers = iter(script)

    def do(step: Step) -> Any:
        asked.append("run" if isinstance(step, Run) else step.what)
        assert isinstance(step, Run | Call)
        _, reply = next(answers)
        if isinstance(reply, StoreError):
            raise reply
        return reply

    return do, asked


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_delivery_takes_its_steps_to_its_verdict(case: str) -> None:
    message, script, verdict, delay, pause, dead_attempts = CASES[case]
    do, asked = scripted(script)
    answer = drive(flow().process(message), do)
    assert asked == [what for what, _ in script]
    assert (answer.verdict, answer.delay, answer.pause) == (verdict, delay, pause)
    if dead_attempts is None:
        assert answer.reason is None
    else:
        assert answer.reason is not None
        assert answer.reason["x-inbox-attempts"] == dead_attempts


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_asyncio_driver_takes_the_same_steps(case: str) -> None:
    message, script, *_ = CASES[case]
    do, asked = scripted(script)
    blocking = drive(flow().process(message), scripted(script)[0])

    async def ado(step: Step) -> Any:
        await asyncio.sleep(0)
        return do(step)

    answer: Answer = asyncio.run(drive_async(flow().process(message), ado))
    assert asked == [what for what, _ in script]
    assert answer == blocking
