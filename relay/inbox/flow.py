"""One delivery's way through the inbox, written once for the blocking and the asyncio
inboxes: a generator that yields what it needs done (a statement of the inbox's own, or the
handler's run in the transaction that holds the key) and decides from what it is sent back
(or the StoreError thrown in) what the broker is answered. ``drive`` and ``drive_async``
run it against a store; the decisions themselves do no I/O.

Only a handler that raised (or ended the inbox's transaction), or a run that died inside the
handler, is charged an attempt: never a database error, a lock wait, or a delivery that came
again without having reached its handler."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Generator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

from relay.constants import INBOX_PURGE_CHUNK, INBOX_PURGE_SLICE_S
from relay.db.inbox import InboxStatements, Outcome, Ran
from relay.errors import StoreError
from relay.inbox.policy import (
    RetrySchedule,
    dead_letter_headers,
    key_problem,
    too_many_before,
    window_problem,
)
from relay.metrics import InboxMetrics
from relay.records import Answer, Delivery, Verdict
from relay.settings import InboxSettings

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Call:
    """One of ``InboxStatements`` (``statement``, with ``args``), in a transaction of its own."""

    what: str
    statement: Callable[..., Any]
    args: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class Run:
    """The handler's run in the transaction that holds ``key``; sent back: its ``Ran``."""

    key: str


Step = Call | Run
R = TypeVar("R")
Steps = Generator[Step, Any, R]


class Flow:
    """The inbox's decisions for one consumer: its settings, its statements, its metrics."""

    def __init__(
        self, inbox: InboxSettings, statements: InboxStatements, metrics: InboxMetrics
    ) -> None:
        self.inbox = inbox
        self.statements = statements
        self.metrics = metrics
        self.schedule = RetrySchedule.of(inbox)

    def starting(self, retention: float) -> Steps[None]:
        """What a consumer says as it starts: a dedupe window shorter than the relay's memory
        of a message, a server that cannot promise durable commits."""
        problem = window_problem(self.inbox.inbox_dedupe_window, retention)
        if problem is not None:
            log.warning("%s", problem, extra={"action": "inbox_window_short"})
        try:
            durability = yield Call(
                "reading the server's durability", self.statements.durability, ()
            )
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
            return Answer(Verdict.DEAD_LETTER, reason=self._why(problem, 0))
        key = delivery.key
        assert key is not None  # key_problem says so
        marked = False
        ran: Ran
        try:
            # A delivery that comes again may follow a run that died inside its handler: its
            # run is marked, outside the transaction (SQLite has one writer, and the
            # transaction holds it), and the mark of a run that died is counted.
            if delivery.redelivered:
                counted = yield Call("marking a run", self.statements.start_run, (key,))
                marked = True
                if too_many_before(counted, self.inbox.inbox_max_attempts):
                    why = "its earlier runs died inside the handler"
                    return (yield from self._dead_letter(key, why))
            ran = yield Run(key)
        except StoreError as exc:
            if marked:
                with contextlib.suppress(StoreError):
                    yield Call("ending a run", self.statements.end_run, (key,))
            return self._store_failed(key, exc)
        if ran.outcome is Outcome.DUPLICATE:
            self.metrics.duplicates.inc()
            return Answer(Verdict.ACK)
        if ran.outcome is Outcome.DONE:
            self.metrics.handler_seconds.observe(ran.seconds)
            self.metrics.processed.inc()
            return Answer(Verdict.ACK)
        assert ran.error is not None
        if ran.outcome is Outcome.ENDED:  # its key may have committed with part of the work
            with contextlib.suppress(StoreError):
                yield Call("forgetting a key", self.statements.forget, (key,))
        return (yield from self._failed(key, ran.error))

    def _failed(self, key: str, exc: Exception) -> Steps[Answer]:
        error = f"{type(exc).__name__}: {exc}"
        try:
            attempts = yield Call(
                "counting an attempt", self.statements.count_attempt, (key, error)
            )
        except StoreError as failed:  # uncounted: as a database failure
            return self._store_failed(key, failed)
        answer = self.schedule.after(attempts)
        if answer.verdict is Verdict.DEAD_LETTER:
            return (yield from self._dead_letter(key, error))
        log.warning(
            "message %s failed (attempt %d of %d), %s: %s",
            key,
            attempts,
            self.inbox.inbox_max_attempts,
            f"again in {answer.delay:g} s" if answer.delay else "requeued",
            error,
            extra={"action": "inbox_retry", "message_id": key, "delay_s": answer.delay},
        )
        self.metrics.retried.inc()
        return answer

    def _dead_letter(self, key: str, why: str) -> Steps[Answer]:
        log.error(
            "message %s dead-lettered after %d attempts: %s",
            key,
            self.inbox.inbox_max_attempts,
            why,
            extra={"action": "inbox_dead_letter", "message_id": key},
        )
        self.metrics.dead_lettered.inc()
        try:
            failures = yield Call("reading attempts", self.statements.failures, (key,))
        except StoreError:  # the reason without its counts, rather than no dead letter
            failures = None
        if failures is None:
            return Answer(Verdict.DEAD_LETTER, reason=self._why(why, 0))
        reason = self._why(
            failures.last_error or why,
            failures.attempts,
            first=failures.first_failed_at,
            last=failures.last_failed_at,
        )
        return Answer(Verdict.DEAD_LETTER, reason=reason)

    def _why(
        self,
        error: str,
        attempts: int,
        *,
        first: datetime | None = None,
        last: datetime | None = None,
    ) -> dict[str, object]:
        return dead_letter_headers(
            self.inbox.inbox_consumer,
            self.inbox.inbox_queue,
            error,
            attempts,
            first_failure=first,
            last_failure=last,
        )

    def _store_failed(self, key: str, exc: StoreError) -> Answer:
        """The inbox's own statements failed (the database is away): the delivery is not
        counted, and the consumer stops taking deliveries until the database answers (each
        would fail the same way, and a requeue loop would spend a quorum queue's delivery
        limit): requeued with the consumer cancelled (``Inbox``, ``AsyncInbox``), or held
        (the FastStream middleware)."""
        log.warning(
            "message %s not handled, uncounted: consuming paused until the database answers: %s",
            key,
            exc,
            extra={"action": "inbox_database_retry", "message_id": key},
        )
        self.metrics.database_errors.inc()
        return Answer(Verdict.RETRY, pause=True)

    def database_answers(self) -> Steps[bool]:
        """Whether the database answers again, for a consumer paused while it was away."""
        try:
            yield Call("reaching the database", self.statements.ping, ())
        except StoreError as exc:
            log.info("database still away: %s", exc, extra={"action": "inbox_database_waiting"})
            return False
        log.info("database answers: consuming again", extra={"action": "inbox_resumed"})
        return True

    def purge_slice(self) -> Steps[bool]:
        """A slice of the purge of ids older than the dedupe window: chunks of
        ``INBOX_PURGE_CHUNK``, each a short transaction, for at most ``INBOX_PURGE_SLICE_S``,
        so that the consumer's connection is serviced between slices. Whether more is left."""
        deleted, full = 0, True
        until = time.monotonic() + INBOX_PURGE_SLICE_S
        window = self.inbox.inbox_dedupe_window
        while full and time.monotonic() < until:
            try:
                count = yield Call(
                    "purging the inbox", self.statements.purge_one, (window, INBOX_PURGE_CHUNK)
                )
            except StoreError as exc:
                log.warning("inbox purge failed: %s", exc, extra={"action": "inbox_purge_failed"})
                return False
            deleted += count
            full = count == INBOX_PURGE_CHUNK
        if deleted:
            log.info(
                "purged %d expired ids", deleted, extra={"action": "inbox_purged", "rows": deleted}
            )
        return full


def drive(steps: Steps[R], do: Callable[[Step], Any]) -> R:
    """Run ``steps`` to their answer, each step done by ``do`` (its StoreError thrown back)."""
    reply: Any = None
    error: StoreError | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            result: R = done.value
            return result
        reply, error = None, None
        try:
            reply = do(step)
        except StoreError as exc:
            error = exc


async def drive_async(steps: Steps[R], do: Callable[[Step], Awaitable[Any]]) -> R:
    """``drive`` for a ``do`` that is awaited."""
    reply: Any = None
    error: StoreError | None = None
    while True:
        try:
            step = steps.send(reply) if error is None else steps.throw(error)
        except StopIteration as done:
            result: R = done.value
            return result
        reply, error = None, None
        try:
            reply = await do(step)
        except StoreError as exc:
            error = exc
