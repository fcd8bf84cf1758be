"""One delivery's way through the inbox (``relay.inbox.flow``), table-driven: the steps it
asks for, what each answers (or the StoreError it raises), and the verdict; no I/O, the
same decisions the blocking and the asyncio inboxes drive."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa

from relay.db.inbox import TransactionFailed
from relay.db.inbox_listeners import ListenersLeft
from relay.db.inbox_statements import CRASHED, Failures, InboxStatements
from relay.db.inbox_transaction import TransactionEnded
from relay.errors import StoreError
from relay.inbox import InboxSettings
from relay.inbox.flow import Flow
from relay.inbox.policy import COMMITTED_IN_PART
from relay.inbox.steps import drive, drive_async
from relay.metrics import InboxMetrics
from relay.records import Answer, Delivery, Verdict

DOWN = StoreError("the database is away")
HELD = 300.0  # a dead letter's wait in a retry queue if the dead letters' queue refuses it
AT = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
BROKE = ValueError("broke")
DEFERRED = TransactionFailed("a deferred constraint failed at the commit")


def delivery(
    message_id: str | bytes | None = "m-1",
    redelivered: bool = False,
    headers: dict[str, object] | None = None,
) -> Delivery:
    return Delivery(message_id, b"{}", "x", "k", None, headers or {}, redelivered)


# A dead letter's failure recorded with its key kept (``Flow._not_again``).
KEPT = f"TransactionEnded: {COMMITTED_IN_PART}; it failed with ValueError"


def failures(attempts: int, error: str = "ValueError") -> Failures:
    return Failures(attempts, error, AT, AT)


# The steps of a first delivery's run that commits.
RUN = [("open", True), ("handle", None), ("checking the key", True), ("commit", None)]
# ... and of one whose handler raises, its key not committed, rolled back.
RAISED = [
    ("open", True),
    ("handle", BROKE),
    ("looking for the key", False),
    ("went_on", False),
    ("rollback", None),
]
# ... and the end of one whose transaction was rolled back under a handler that went on:
# dead-lettered at once, its key kept.
WENT_ON = [
    ("went_on", True),
    ("rollback", None),
    ("keeping the key", True),
    ("counting an attempt", 1),
    ("reading attempts", failures(1, "TransactionEnded: ...")),
]

# name -> (the delivery, [(the step it asks, its answer or the error it raises)], the verdict,
# the delay, whether it pauses, the dead letter's attempts (or None))
CASES: dict[str, tuple[Delivery, list[tuple[str, Any]], Verdict, float, bool, int | None]] = {
    "a message without a key: dead-lettered, nothing asked": (
        delivery(None),
        [],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        0,
    ),
    "a id that is not UTF-8: dead-lettered, nothing asked": (
        delivery(b"\xff"),
        [],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        0,
    ),
    "processed: acked": (delivery(), RUN, Verdict.ACK, 0, False, None),
    "a duplicate: acked, the handler not run": (
        delivery(),
        [("open", False), ("rollback", None), ("reading attempts", None)],
        Verdict.ACK,
        0.0,
        False,
        None,
    ),
    "the first failure: again at once": (
        delivery(),
        [*RAISED, ("counting an attempt", 1)],
        Verdict.RETRY,
        0.0,
        False,
        None,
    ),
    "the second failure: again after the first delay, its mark ended by the count": (
        delivery(redelivered=True),
        [("marking a run", 1), *RAISED, ("counting an attempt", 2)],
        Verdict.DELAY,
        5.0,
        False,
        None,
    ),
    "the last failure: dead-lettered with its failures": (
        delivery(redelivered=True),
        [
            ("marking a run", 4),
            *RAISED,
            ("counting an attempt", 5),
            ("reading attempts", failures(5)),
        ],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        5,
    ),
    "runs that died used it up: dead-lettered before the handler": (
        delivery(redelivered=True),
        [("marking a run", 5), ("ending a run", None), ("reading attempts", failures(5, CRASHED))],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        5,
    ),
    "a redelivery of a message processed (its ack lost): acked, nothing counted": (
        delivery(redelivered=True),
        [("marking a run", None), ("reading attempts", None)],
        Verdict.ACK,
        0.0,
        False,
        None,
    ),
    "a dead letter with its key kept, back (its letter maybe never published): dead-lettered": (
        delivery(redelivered=True),
        [
            ("marking a run", None),
            ("reading attempts", failures(1, KEPT)),
            ("reading attempts", failures(1, KEPT)),
        ],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        1,
    ),
    "a duplicate of a message that failed, then was processed: acked": (
        delivery(redelivered=True),
        [("marking a run", None), ("reading attempts", failures(2))],
        Verdict.ACK,
        0.0,
        False,
        None,
    ),
    "a redelivered run that commits: its mark ended with the commit": (
        delivery(redelivered=True),
        [
            ("marking a run", 2),
            ("open", True),
            ("handle", None),
            ("checking the key", True),
            ("ending a run", None),
            ("commit", None),
        ],
        Verdict.ACK,
        0.0,
        False,
        None,
    ),
    "a redelivered duplicate found at the key: its mark ended, committed": (
        delivery(redelivered=True),
        [
            ("marking a run", 1),
            ("open", False),
            ("ending a run", None),
            ("commit", None),
            ("reading attempts", failures(1)),
        ],
        Verdict.ACK,
        0.0,
        False,
        None,
    ),
    "the database away in the run: requeued uncounted, paused": (
        delivery(redelivered=True),
        [("marking a run", 0), ("open", True), ("handle", DOWN)],
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
        [*RAISED, ("counting an attempt", DOWN)],
        Verdict.RETRY,
        0.0,
        True,
        None,
    ),
    "the database away at the commit: requeued uncounted, paused": (
        delivery(),
        [*RUN[:-1], ("commit", DOWN)],
        Verdict.RETRY,
        0.0,
        True,
        None,
    ),
    "the commit failed, the connection alive (a deferred constraint): a failure": (
        delivery(),
        [*RUN[:-1], ("commit", DEFERRED), ("counting an attempt", 1)],
        Verdict.RETRY,
        0.0,
        False,
        None,
    ),
    "the transaction aborted under the handler (its error swallowed): a failure": (
        delivery(),
        [
            ("open", True),
            ("handle", None),
            ("checking the key", DEFERRED),
            ("looking for the key", False),
            ("went_on", False),
            ("rollback", None),
            ("counting an attempt", 1),
        ],
        Verdict.RETRY,
        0.0,
        False,
        None,
    ),
    "the handler rolled back past tx and returned: a failure, nothing to forget": (
        delivery(),
        [
            ("open", True),
            ("handle", None),
            ("checking the key", False),
            ("looking for the key", False),
            ("went_on", False),
            ("rollback", None),
            ("counting an attempt", 1),
        ],
        Verdict.RETRY,
        0.0,
        False,
        None,
    ),
    "the handler committed past tx and raised: dead-lettered at its first failure": (
        delivery(),
        [
            ("open", True),
            ("handle", BROKE),
            ("looking for the key", True),
            ("rollback", None),
            ("counting an attempt", 1),
            ("reading attempts", failures(1, "TransactionEnded: ...")),
        ],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        1,
    ),
    "committed past tx, then its transaction failed at the key's look: dead-lettered too": (
        delivery(),
        [
            ("open", True),
            ("handle", None),
            ("checking the key", DEFERRED),
            ("looking for the key", True),
            ("rollback", None),
            ("counting an attempt", 1),
            ("reading attempts", failures(1, "TransactionEnded: ...")),
        ],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        1,
    ),
    "rolled back under the handler, which went on: dead-lettered, its key kept": (
        delivery(),
        [
            ("open", True),
            ("handle", None),
            ("checking the key", False),
            ("looking for the key", False),
            *WENT_ON,
        ],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        1,
    ),
    "ended under the handler, the key committed meanwhile (its own commit or a second "
    "delivery's): dead-lettered at once, its key kept": (
        delivery(),
        [
            ("open", True),
            ("handle", None),
            ("checking the key", False),
            ("looking for the key", True),
            ("rollback", None),
            ("counting an attempt", 1),
            ("reading attempts", failures(1, "TransactionEnded: ...")),
        ],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        1,
    ),
    "rolled back under the handler, which went on and raised: dead-lettered alike": (
        delivery(),
        [
            ("open", True),
            ("handle", BROKE),
            ("looking for the key", False),
            *WENT_ON,
        ],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        1,
    ),
    "a part its rollback left in place (a table without transactions): dead-lettered at once, "
    "its key kept": (
        delivery(),
        [
            ("open", True),
            ("handle", BROKE),
            ("looking for the key", False),
            ("went_on", False),
            ("rollback", True),
            ("keeping the key", True),
            ("counting an attempt", 1),
            ("reading attempts", failures(1, "TransactionEnded: ...")),
        ],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        1,
    ),
    "listeners the handler left: dead-lettered at its first failure, nothing kept": (
        delivery(),
        [
            ("open", True),
            ("handle", ListenersLeft("left")),
            ("looking for the key", False),
            ("went_on", False),
            ("rollback", False),
            ("counting an attempt", 1),
            ("reading attempts", failures(1, "ListenersLeft: ...")),
        ],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        1,
    ),
    "the failures unread: dead-lettered with the reason alone": (
        delivery(),
        [*RAISED, ("counting an attempt", 5), ("reading attempts", DOWN)],
        Verdict.DEAD_LETTER,
        HELD,
        False,
        0,
    ),
}


def flow() -> Flow:
    settings = InboxSettings.load({}, {"inbox_queue": "q"})
    statements = InboxStatements(sa.create_engine("sqlite://").dialect, "q")
    return Flow(settings, statements, InboxMetrics("q"))


class Scripted:
    """A ``Doer`` that answers each step from a script in turn (its StoreError raised), and
    the steps it was asked, with what they were asked with."""

    def __init__(self, script: list[tuple[str, Any]]) -> None:
        self.asked: list[str] = []
        self.args: list[tuple[Any, ...]] = []
        self._answers = iter(script)

    def _answer(self, name: str, args: tuple[Any, ...]) -> Any:
        self.asked.append(name)
        self.args.append(args)
        _, reply = next(self._answers)
        if isinstance(reply, StoreError):
            raise reply
        return reply

    def call(self, what: str, _statement: Any, *args: Any) -> Any:
        return self._answer(what, args)

    def execute(self, what: str, _statement: Any, *args: Any) -> Any:
        return self._answer(what, args)

    def open(self, key: str) -> Any:
        return self._answer("open", (key,))

    def handle(self) -> Any:
        return self._answer("handle", ())

    def went_on(self) -> Any:
        return self._answer("went_on", ())

    def commit(self) -> Any:
        return self._answer("commit", ())

    def rollback(self, discard: bool) -> Any:
        return self._answer("rollback", (discard,))


class Awaited:
    """``Scripted``'s answers, awaited."""

    def __init__(self, scripted: Scripted) -> None:
        self._scripted = scripted

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._scripted, name)

        async def awaited(*args: Any) -> Any:
            await asyncio.sleep(0)
            return method(*args)

        return awaited


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_a_delivery_takes_its_steps_to_its_verdict(case: str) -> None:
    message, script, verdict, delay, pause, dead_attempts = CASES[case]
    doer = Scripted(script)
    answer = drive(flow().process(message), doer)
    assert doer.asked == [what for what, _ in script]
    assert (answer.verdict, answer.delay, answer.pause) == (verdict, delay, pause)
    if dead_attempts is None:
        assert answer.reason is None
    else:
        assert answer.reason is not None
        assert answer.reason["x-inbox-attempts"] == dead_attempts


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_the_asyncio_driver_takes_the_same_steps(case: str) -> None:
    message, script, *_ = CASES[case]
    blocking = drive(flow().process(message), Scripted(script))
    doer = Scripted(script)
    answer: Answer = asyncio.run(drive_async(flow().process(message), Awaited(doer)))
    assert doer.asked == [what for what, _ in script]
    assert answer == blocking


def test_a_handler_that_ended_the_transaction_has_its_connection_discarded() -> None:
    """Its session may have been changed with the transaction (MySQL's autocommit, say)."""
    for handled, committed, went_on in (
        (TransactionEnded("ended"), False, False),
        (BROKE, True, None),
        (BROKE, False, True),
    ):
        looked = [] if went_on is None else [("went_on", went_on)]
        kept = [("keeping the key", True)] if went_on else []
        doer = Scripted(
            [
                ("open", True),
                ("handle", handled),
                ("looking for the key", committed),
                *looked,
                ("rollback", None),
                *kept,
                ("counting an attempt", 1),
                ("reading attempts", failures(1)),
            ]
        )
        drive(flow().process(delivery()), doer)
        assert doer.args[doer.asked.index("rollback")] == (True,)  # rollback(discard=True)


def test_a_part_committed_past_tx_is_dead_lettered_naming_why() -> None:
    """Its key committed with it: run again, the handler would do that part twice. Counted
    with a reason that says so (and what the handler raised), the key kept, dead-lettered."""
    doer = Scripted(
        [
            ("open", True),
            ("handle", BROKE),
            ("looking for the key", True),
            ("rollback", None),
            ("counting an attempt", 1),
            ("reading attempts", None),
        ]
    )
    answer = drive(flow().process(delivery()), doer)
    assert answer.verdict is Verdict.DEAD_LETTER
    counted = doer.args[4]
    assert counted[:1] == ("m-1",) and len(counted) == 2  # the key not forgotten
    why = counted[1]
    assert why.startswith("TransactionEnded: the handler committed")
    assert "ValueError" in why
    assert answer.reason is not None and answer.reason["x-inbox-error"] == why


def test_a_run_the_database_went_away_in_is_no_crash() -> None:
    """Its mark, left set, is ended before the message runs again: by the database's return,
    or by the next delivery of the key."""
    inbox = flow()
    away = [("marking a run", 0), ("open", True), ("handle", DOWN)]
    assert drive(inbox.process(delivery(redelivered=True)), Scripted(away)).pause
    back = Scripted([("reaching the database", None), ("ending a run", None)])
    assert drive(inbox.database_answers(), back)
    assert back.asked == ["reaching the database", "ending a run"]
    assert drive(inbox.process(delivery(redelivered=True)), Scripted(away)).pause
    again = Scripted(
        [("ending a run", None), ("marking a run", 0), *RUN[:-1], ("ending a run", None), RUN[-1]]
    )
    assert drive(inbox.process(delivery(redelivered=True)), again).verdict is Verdict.ACK
    assert again.asked[0] == "ending a run"


def server_flow() -> Flow:
    """The flow on a database whose second connection can write beside the open one."""
    settings = InboxSettings.load({}, {"inbox_queue": "q"})
    statements = InboxStatements(sa.create_engine("postgresql+psycopg://").dialect, "q")
    return Flow(settings, statements, InboxMetrics("q"))


# name -> (the steps, each with its answer, the verdict): a redelivered message on a server,
# marked once its key is held (no other consumer's live run can hold it then).
SERVER: dict[str, tuple[list[tuple[str, Any]], Verdict]] = {
    "marked after its key, the mark ended with the commit": (
        [
            ("open", True),
            ("marking a run", 1),
            ("handle", None),
            ("checking the key", True),
            ("ending a run", None),
            ("commit", None),
        ],
        Verdict.ACK,
    ),
    "processed: acked at its key, nothing marked": (
        [("open", False), ("rollback", None), ("reading attempts", None)],
        Verdict.ACK,
    ),
    "its runs died: dead-lettered, its key let go": (
        [
            ("open", True),
            ("marking a run", 5),
            ("ending a run", None),
            ("reading attempts", failures(5, CRASHED)),
            ("rollback", None),
        ],
        Verdict.DEAD_LETTER,
    ),
}


@pytest.mark.parametrize("case", SERVER, ids=list(SERVER))
def test_a_redelivered_run_on_a_server_is_marked_once_its_key_is_held(case: str) -> None:
    script, verdict = SERVER[case]
    doer = Scripted(script)
    answer = drive(server_flow().process(delivery(redelivered=True)), doer)
    assert doer.asked == [what for what, _ in script]
    assert answer.verdict is verdict


def test_a_kept_key_dead_letter_back_on_a_server_is_dead_lettered_once_its_key_is_seen() -> None:
    """On a server, its key is seen committed as the run opens: dead-lettered from there."""
    script = [("open", False), ("rollback", None), *[("reading attempts", failures(3, KEPT))] * 2]
    doer = Scripted(script)
    answer = drive(server_flow().process(delivery(redelivered=True)), doer)
    assert doer.asked == [what for what, _ in script]
    assert answer.verdict is Verdict.DEAD_LETTER


def test_a_message_the_connection_is_lost_under_again_and_again_is_counted() -> None:
    """Lost under its run, the database answering in between: the database away twice
    (uncounted, paused); the third time in a row, the message's own failure."""
    inbox = flow()
    lost = [("open", True), ("handle", DOWN)]
    for _ in range(2):
        assert drive(inbox.process(delivery()), Scripted(lost)).pause
    third = Scripted([*lost, ("rollback", None), ("counting an attempt", 1)])
    answer = drive(inbox.process(delivery()), third)
    assert (answer.verdict, answer.pause) == (Verdict.RETRY, False)
    assert third.asked[-1] == "counting an attempt"
    # Another message in between starts the count again.
    assert drive(inbox.process(delivery()), Scripted(lost)).pause
    assert drive(inbox.process(delivery("m-2")), Scripted(RUN)).verdict is Verdict.ACK
    assert drive(inbox.process(delivery()), Scripted(lost)).pause


def test_the_inboxs_own_fault_on_a_message_is_counted_never_the_consumers_end() -> None:
    doer = Scripted([("counting an attempt", 1)])
    answer = drive(flow().broke(delivery(), TypeError("a fault of the inbox's own")), doer)
    assert (answer.verdict, answer.pause) == (Verdict.RETRY, False)
    unkeyed = drive(flow().broke(delivery(None), TypeError("x")), Scripted([]))
    assert (unkeyed.verdict, unkeyed.pause) == (Verdict.RETRY, True)
