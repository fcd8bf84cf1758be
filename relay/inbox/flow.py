"""One delivery's way through the inbox, written once for the blocking and the asyncio
inboxes: a generator that yields what it needs done (``Step``: a statement in a transaction
of its own, or a move of the message's own transaction: open it with the key, run the
handler, a statement in it, commit, roll back) and decides from what it is sent back (or
the error thrown in) what the broker is answered, with no I/O of its own (``relay.inbox.steps``
runs it against ``relay.db.inbox.InboxStore`` and its asyncio twin).

What counts as a failed attempt, and nothing else does:
- the handler raised (not because the inbox's connection was lost: that is the database
  away);
- the message's transaction failed at its end, the connection alive: a deferred constraint
  at the commit, a transaction the handler's swallowed error aborted;
- the handler ended the inbox's transaction, or tried to (the guard refused it, or its key
  is not in the transaction at the end); one that committed a part of its work past the
  guard with the key and then failed is dead-lettered at once, its key kept: run again, it
  would do that part twice;
- a run that died inside the handler (its consumer killed): its mark found still set.
Never a database error of the inbox's own, a lock wait, or a delivery that came again
without having reached its handler. A message whose key is there is acked as processed
before anything is counted, however often it came, but for one dead-lettered with its key
kept (its recorded failure says so): dead-lettered again."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from relay.constants import INBOX_LOST_AT_ONE_MESSAGE
from relay.db.inbox import Interrupted, TransactionFailed
from relay.db.inbox_listeners import ListenersLeft
from relay.db.inbox_statements import CRASHED, Failures, InboxStatements
from relay.db.inbox_transaction import TransactionEnded
from relay.errors import StoreError
from relay.inbox.policy import (
    COMMITTED_IN_PART,
    ENDED_KEY_COMMITTED,
    NOT_UNDONE,
    WENT_ON,
    RetrySchedule,
    dead_letter_headers,
    describe,
    kept_key,
    key_problem,
    too_many_before,
    window_problem,
)
from relay.inbox.steps import (
    COMMIT,
    HANDLE,
    LOOK_AT_TRANSACTION,
    Steps,
    call,
    in_transaction,
    open_with,
    roll_back,
)
from relay.metrics import InboxMetrics
from relay.records import Answer, Delivery, Verdict
from relay.settings import InboxSettings

log = logging.getLogger(__name__)


@dataclass(slots=True)
class _Run:
    """A delivery's run: its key, whether it came again, whether its run is marked, what cut
    its handler off (``Interrupted``), raised once the run is over."""

    key: str
    redelivered: bool
    marked: bool = False
    interrupted: BaseException | None = None


class Flow:
    """The inbox's decisions for one consumer: its settings, its statements, its metrics,
    and the runs whose marks it could not end while the database was away."""

    def __init__(
        self, inbox: InboxSettings, statements: InboxStatements, metrics: InboxMetrics
    ) -> None:
        self.inbox = inbox
        self.statements = statements
        self.metrics = metrics
        self.schedule = RetrySchedule.of(inbox)
        # Keys whose run this consumer marked and could not end (the database went away in
        # it): no crash, ended once the database answers, before the key is run again.
        self._unended: set[str] = set()
        # The key whose run the connection was last lost under, and how many times in a row.
        self._lost_at: tuple[str, int] | None = None

    def describe(self, error: BaseException) -> str:
        return describe(
            error, self.statements.error_facts, messages=self.inbox.inbox_error_messages
        )

    def starting(self, retention: float) -> Steps[None]:
        """What a consumer says as it starts: a dedupe window shorter than the relay's memory
        of a message, a server that cannot promise durable commits."""
        problem = window_problem(self.inbox.inbox_dedupe_window, retention)
        if problem is not None:
            log.warning("%s", problem, extra={"action": "inbox_window_short"})
        try:
            durability = yield call("reading the server's durability", self.statements.durability)
        except StoreError:  # a database away now is the consumer's to wait out
            return
        if durability is not None:
            log.warning("%s", durability, extra={"action": "inbox_not_durable"})

    def process(self, delivery: Delivery) -> Steps[Answer]:
        """One delivery: the steps it takes, then its answer."""
        problem = key_problem(delivery)
        if problem is not None:
            log.error(
                "dead-lettered a delivery from %r: %s",
                delivery.exchange,
                problem,
                extra={"action": "inbox_unkeyed"},
            )
            self.metrics.dead_lettered.inc()
            held = self.schedule.max_delay  # if the dead letters' queue refuses it
            return Answer(Verdict.DEAD_LETTER, held, reason=self._why(problem, None))
        key = delivery.key
        assert key is not None  # key_problem says so
        run = _Run(key, delivery.redelivered)
        try:
            if key in self._unended:
                yield call("ending a run", self.statements.end_run, key)
                self._unended.discard(key)
            return (yield from self._run(run))
        except StoreError as exc:
            if run.marked:
                self._unended.add(key)
            if run.interrupted is not None:  # never swallowed, the database away or not
                raise run.interrupted from exc
            return self._store_failed(key, exc)

    def _mark(self, run: _Run) -> Steps[Answer | None]:
        """A delivery that comes again may follow a run that died inside its handler: its
        run is marked, in a transaction of its own, and the mark of a run that died is counted
        (``InboxStatements.start_run``); the answer when that is the end of it (processed
        before: acked; its attempts used up: dead-lettered), else None."""
        counted = yield call("marking a run", self.statements.start_run, run.key)
        if counted is None:  # its key committed: nothing marked or counted
            return (yield from self._processed(run.key))
        run.marked = True
        if not too_many_before(counted, self.inbox.inbox_max_attempts):
            return None
        # Not run: its mark ended, or the next delivery (a dead letter the broker refused
        # comes back) would count a run that never was. Its reason is its last failure's: a
        # crash, or what it was before the delivery came again (its dead letter's ack lost,
        # its dead letter held back).
        yield call("ending a run", self.statements.end_run, run.key)
        return (yield from self._dead_letter(run.key, None))

    def _run(self, run: _Run) -> Steps[Answer]:
        """The handler's run in the transaction that holds the message's key. A redelivered
        run is marked once the key is held (no other consumer's live run can hold it then:
        a mark found set is a run that died), where a second connection can write beside
        the open transaction; with one writer (SQLite) before the key, a lock around the
        delivery (``relay.db.inbox``'s run lock) keeping another consumer's run out."""
        key = run.key
        one_writer = self.statements.database.one_writer
        if run.redelivered and one_writer and (answer := (yield from self._mark(run))):
            return answer
        if not (yield open_with(key)):  # processed before
            if run.marked:
                yield in_transaction("ending a run", self.statements.end_run, key)
                yield COMMIT
            else:
                yield roll_back()
            return (yield from self._processed(key))
        if run.redelivered and not one_writer and (answer := (yield from self._mark(run))):
            yield roll_back()
            return answer
        try:
            return (yield from self._handled(run))
        except StoreError as exc:
            if isinstance(exc, TransactionFailed):
                raise
            return (yield from self._lost(run, exc))

    def _processed(self, key: str) -> Steps[Answer]:
        """A delivery whose key is committed: processed before (its ack lost), acked; or
        dead-lettered with its key kept (``_not_again``, its last failure says so), and its
        dead letter maybe never published (the broker's connection lost before its confirm,
        its queue and the retry queue both refusing it): dead-lettered again, never run.
        Acked, it would be lost. The attempts, not the delivery, say so: a producer's
        header cannot make a duplicate a dead letter, and ``relay inbox requeue``, which
        forgets them, has the message acked as processed."""
        failures = yield call("reading attempts", self.statements.failures, key)
        if failures is not None and kept_key(failures.last_error):
            return (yield from self._dead_letter(key, None))
        self.metrics.duplicates.inc()
        return Answer(Verdict.ACK)

    def _handled(self, run: _Run) -> Steps[Answer]:
        """The handler, then the commit or the rollback, and the answer."""
        key, started = run.key, time.perf_counter()
        error: Exception | None = yield HANDLE
        if isinstance(error, Interrupted):
            run.interrupted = error.interruption
        # Whether the key committed with part of the work: a handler that ended the
        # transaction past the guard and then failed (``_committed_in_part``). Looked at from
        # a connection of its own while the message's transaction is still open: only a
        # committed key is seen there, never another consumer's (a second delivery of the
        # message waits on the open key).
        committed = ended = False
        if error is None:
            try:
                if (yield in_transaction("checking the key", self.statements.holds_key, key)):
                    if run.marked:
                        yield in_transaction("ending a run", self.statements.end_run, key)
                    try:
                        yield COMMIT
                    except TransactionFailed as failed:  # over, and nothing of it committed
                        return (yield from self._failed(key, failed))
                    self.metrics.handler_seconds.observe(time.perf_counter() - started)
                    self.metrics.processed.inc()
                    self._lost_at = None
                    return Answer(Verdict.ACK)
                # Ended past ``Transaction`` (through the driver, a procedure, a statement
                # that rolls back as it fails, a deadlock): the transaction here is another,
                # without the key this run inserted, and is rolled back too. The key may be
                # committed all the same, where the database cannot tell the handler's own
                # commit from another delivery's that ran once the key went.
                ended = True
                error = TransactionEnded(
                    "the handler ended the inbox's transaction: its key was not in the "
                    "transaction at the end"
                )
                committed = yield call("looking for the key", self.statements.key_committed, key)
            except TransactionFailed as failed:
                error = failed
                committed = yield call("looking for the key", self.statements.key_committed, key)
        else:
            committed = yield call("looking for the key", self.statements.key_committed, key)
        # Rolled back under the handler, which went on: what it did after ran outside the
        # message's transaction, and may have been committed (its driver's commit, SQLite's
        # autocommit of a statement sent with no transaction open).
        went_on = not committed and (yield LOOK_AT_TRANSACTION)
        # A connection whose transaction the handler ended may have had its session changed
        # too: it is not used again.
        # A part its rollback left in place (a table without transactions) is as committed.
        kept = yield roll_back(discard=committed or went_on or isinstance(error, TransactionEnded))
        if committed:
            why_not = ENDED_KEY_COMMITTED if ended else COMMITTED_IN_PART
            return (yield from self._not_again(key, error, why_not))
        if went_on or kept:
            yield call("keeping the key", self.statements.add_key, key)
            return (yield from self._not_again(key, error, WENT_ON if went_on else NOT_UNDONE))
        if run.interrupted is not None:  # as a consumer that died in its handler: uncounted
            raise run.interrupted
        # Listeners a handler left would be left again at each run: not tried again.
        return (yield from self._failed(key, error, at_once=isinstance(error, ListenersLeft)))

    def _not_again(self, key: str, error: Exception, why_not: str) -> Steps[Answer]:
        """A part of the handler's work may have been committed past the guard: with the
        message's key (``COMMITTED_IN_PART``: through its driver's connection, a procedure
        that commits), or after its transaction ended under it (``WENT_ON``), the key then
        committed here. Run again, it would do that part again: dead-lettered at once, its
        attempt counted with why; the key kept, so that a delivery of the message again is
        not run but dead-lettered again (``_processed``: an operator who would have it run
        again takes it from the dead letters knowing what it did). A handler cut off
        (``Interrupted``): its interruption raised by the consumer once the broker is
        answered."""
        cut = error.interruption if isinstance(error, Interrupted) else None
        failed = self.describe(cut or error)
        why = f"{self.describe(TransactionEnded(why_not))}; it failed with {failed}"
        yield call("counting an attempt", self.statements.count_attempt, key, why)
        return (yield from self._dead_letter(key, why))._replace(interrupted=cut)

    def _lost(self, run: _Run, exc: StoreError) -> Steps[Answer]:
        """The message's connection was lost under its run: the database away, uncounted
        (raised on), unless it was lost at this very message ``INBOX_LOST_AT_ONE_MESSAGE``
        times in a row, the database answering each time in between (the consumer takes
        deliveries again only then): then the message is what breaks it (a write larger
        than the server takes, a statement that kills its backend), and it is counted as a
        failure, or it would hold its queue for ever."""
        key = run.key
        seen = self._lost_at[1] + 1 if self._lost_at and self._lost_at[0] == key else 1
        self._lost_at = (key, seen)
        if seen < INBOX_LOST_AT_ONE_MESSAGE:
            raise exc
        self._lost_at = None
        yield roll_back()
        log.warning(
            "message %s: the database's connection was lost under it %d times in a row, the "
            "database answering in between: counted as its failure",
            key,
            seen,
            extra={"action": "inbox_lost_at_message", "message_id": key},
        )
        return (yield from self._failed(key, exc))

    def broke(self, delivery: Delivery, error: Exception) -> Steps[Answer]:
        """The inbox itself failed on ``delivery`` (a fault of this package's, or of what it
        runs on, that this message set off): logged, and counted as a failed attempt, so that
        a message that sets it off every time is dead-lettered, never dropped nor tried for
        ever; requeued uncounted, the consumer paused, where it cannot be counted."""
        key = None if key_problem(delivery) else delivery.key
        log.error(
            "message %s: the inbox failed on it: %s",
            key,
            self.describe(error),
            extra={"action": "inbox_internal_error", "message_id": key},
        )
        self.metrics.internal_errors.inc()
        if key is None:
            return Answer(Verdict.RETRY, pause=True)
        try:
            return (yield from self._failed(key, error))
        except StoreError as exc:
            return self._store_failed(key, exc)

    def _failed(self, key: str, error: Exception, *, at_once: bool = False) -> Steps[Answer]:
        why = self.describe(error)
        attempts = yield call("counting an attempt", self.statements.count_attempt, key, why)
        answer = self.schedule.after(attempts)
        if at_once or answer.verdict is Verdict.DEAD_LETTER:
            return (yield from self._dead_letter(key, why))
        log.warning(
            "message %s failed (attempt %d of %d), %s: %s",
            key,
            attempts,
            self.inbox.inbox_max_attempts,
            f"again in {answer.delay:g} s" if answer.delay else "requeued",
            why,
            extra={"action": "inbox_retry", "message_id": key, "delay_s": answer.delay},
        )
        self.metrics.retried.inc()
        return answer

    def _dead_letter(self, key: str, why: str | None) -> Steps[Answer]:
        """Dead-lettered with its counts and its last failure (``why`` where that is not
        read, or it is not given)."""
        try:
            failures = yield call("reading attempts", self.statements.failures, key)
        except StoreError:  # the reason without its counts, rather than no dead letter
            failures = None
        last = (failures.last_error if failures is not None else None) or why or CRASHED
        log.error(
            "message %s dead-lettered after %d attempts: %s",
            key,
            failures.attempts if failures is not None else self.inbox.inbox_max_attempts,
            last,
            extra={"action": "inbox_dead_letter", "message_id": key},
        )
        self.metrics.dead_lettered.inc()
        held = self.schedule.max_delay  # if the dead letters' queue refuses it
        return Answer(Verdict.DEAD_LETTER, held, reason=self._why(last, failures))

    def _why(self, error: str, failures: Failures | None) -> dict[str, object]:
        """A dead letter's headers: ``error``, and the failures counted (none: 0)."""
        return dead_letter_headers(
            self.inbox.inbox_consumer,
            self.inbox.inbox_queue,
            error,
            0 if failures is None else failures.attempts,
            first_failure=None if failures is None else failures.first_failed_at,
            last_failure=None if failures is None else failures.last_failed_at,
        )

    def _store_failed(self, key: str, exc: StoreError) -> Answer:
        """The database failed the inbox (it is away, or its connection was lost under the
        handler): the delivery is not counted, and the consumer stops taking deliveries
        until the database answers (each would fail the same way, and a requeue loop would
        spend a quorum queue's delivery limit): requeued with the consumer cancelled
        (``Inbox``, ``AsyncInbox``), or held (the FastStream middleware)."""
        log.warning(
            "message %s not handled, uncounted: consuming paused until the database answers: %s",
            key,
            self.describe(exc),
            extra={"action": "inbox_database_retry", "message_id": key},
        )
        self.metrics.database_errors.inc()
        return Answer(Verdict.RETRY, pause=True)

    def database_answers(self) -> Steps[bool]:
        """Whether the database answers again, for a consumer paused while it was away; the
        marks of the runs it was away in are ended first (they were no crash)."""
        try:
            yield call("reaching the database", self.statements.ping)
            for key in sorted(self._unended):
                yield call("ending a run", self.statements.end_run, key)
                self._unended.discard(key)
        except StoreError as exc:
            log.info(
                "database still away: %s",
                self.describe(exc),
                extra={"action": "inbox_database_waiting"},
            )
            return False
        log.info("database answers: consuming again", extra={"action": "inbox_resumed"})
        return True
