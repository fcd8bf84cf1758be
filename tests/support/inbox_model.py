"""The inbox's reference model: what must become of a message whose handler's runs do as its
script says, whatever front end runs it, whatever the broker and the database do around it.

A script is the outcomes of a message's successive handler runs (after its last, the handler
returns). Each outcome is what a handler or its surroundings do in one run:

    return          writes its effect and returns: processed
    raise           writes, then raises (its message quotes a card number): a failure
    duplicate       a statement of the handler's fails on a unique key (the database's error
                    and SQLAlchemy's quote the value): a failure
    die             writes, then its consumer is SIGKILLed inside the handler: a failure,
                    counted when the message comes again, unless the run was on the
                    message's first delivery (not marked: that costs every message nothing;
                    FastStream holds a delivery while the database is away, so runs after
                    ``db_away`` may be on the first delivery still)
    sql_commit      writes, then sends ``/* settle */ COMMIT`` through ``tx``: refused, a
                    failure
    ddl_commit      writes a part, sends ``sa.DDL("COMMIT")`` through ``tx`` (issue 71's
                    door), then raises: refused before it is sent, a failure, nothing
                    committed
    door_return     writes a part, commits through SQLAlchemy's connection behind ``tx``
                    (reached through a result), catches the guard's refusal, writes its
                    effect and returns: a failure all the same, nothing committed
    commit_raise    writes a part, commits it through the driver (past the guard), then
                    raises: its part committed with the key, so dead-lettered at once (run
                    again, that part would be written twice), whatever the attempts left
    untraced_raise  sets the driver's trace callback of its own where it has one (SQLite's,
                    which the inbox's watch of the connection's statements is), rolls back
                    through the driver, writes a part and commits it there, then raises:
                    dead-lettered at once, its key kept (issue 71)
    rollback_return writes, rolls back through the driver, writes again (refused: no
                    transaction is open), returns: a failure, nothing committed; where the
                    database cannot tell whether the session ran on past its transaction's
                    end (PostgreSQL: the driver may have written and committed), dead-lettered
                    at once, its key kept
    listen_return   writes, leaves a SQLAlchemy event listener on the connection behind
                    ``tx`` (reached through a result) that rolls back through the driver at
                    the inbox's own commit, returns: taken off and refused, dead-lettered at
                    once (each run would leave it again), nothing committed (issue 71)
    swallow_return  writes, swallows a failing statement, returns: processed where the
                    database goes on after an error (SQLite, MariaDB), a failure where it
                    aborts the transaction (PostgreSQL)
    lost_ack        writes and returns, and the consumer's connection to the broker is cut
                    before its ack arrives: processed, the message delivered again (a
                    duplicate, acked unrun)
    db_away         the database goes away under the handler (its connection reset, new ones
                    refused for a moment): not a failure, nothing counted, the message
                    requeued

What must hold, and what this module says of each message: processed exactly once (one full
effect) or dead-lettered (none), never both, never lost; dead-lettered only after the
maximum of real failures, with that count, and never once processed; its handler run for
exactly the script's runs up to its fate; the parts committed past ``tx`` as many as the
``commit_raise`` and ``untraced_raise`` runs among them (one at most: the first is the
message's end); its effects at most once (a full effect and a part never both, nor either
twice).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The inbox's front ends, each held to this model: the blocking one (pika), the asyncio one
# (aio-pika), and the asyncio one as FastStream middleware.
FLAVOURS = ("blocking", "asyncio", "faststream")

RETURN = "return"
RAISE = "raise"
DUPLICATE = "duplicate"
DIE = "die"
SQL_COMMIT = "sql_commit"
DDL_COMMIT = "ddl_commit"
DOOR_RETURN = "door_return"
COMMIT_RAISE = "commit_raise"
ROLLBACK_RETURN = "rollback_return"
LISTEN_RETURN = "listen_return"
UNTRACED_RAISE = "untraced_raise"
SWALLOW_RETURN = "swallow_return"
LOST_ACK = "lost_ack"
DB_AWAY = "db_away"
OUTCOMES = (
    RETURN,
    RAISE,
    DUPLICATE,
    DIE,
    SQL_COMMIT,
    DDL_COMMIT,
    DOOR_RETURN,
    COMMIT_RAISE,
    ROLLBACK_RETURN,
    LISTEN_RETURN,
    UNTRACED_RAISE,
    SWALLOW_RETURN,
    LOST_ACK,
    DB_AWAY,
)
PROCESSED = "processed"
DEAD = "dead-lettered"


@dataclass(frozen=True)
class Fate:
    """What may become of a message: processed, or dead-lettered with ``attempts``, after its
    handler ran ``runs`` times, ``parts`` of them committing a part past ``tx``."""

    outcome: str
    runs: int
    parts: int
    attempts: int = 0


def fates(script: Sequence[str], max_attempts: int, postgresql: bool) -> set[Fate]:
    """Every fate the inbox may give a message of ``script`` on PostgreSQL or not (SQLite):
    one, unless a run that died may have been on its first delivery (counted or not, as it
    was or not)."""
    return _Walk(list(script), max_attempts, postgresql).fates(0, failures=0, parts=0)


@dataclass(frozen=True)
class _Walk:
    script: list[str]
    max_attempts: int
    # PostgreSQL aborts a transaction at an error, and cannot tell what a session ran after
    # its transaction ended under the handler.
    postgresql: bool

    def fates(self, run: int, *, failures: int, parts: int) -> set[Fate]:
        """The fates from the ``run``-th run on, with ``failures`` counted and ``parts``
        committed so far."""
        outcome = self.script[run] if run < len(self.script) else RETURN
        runs = run + 1
        if outcome in (RETURN, LOST_ACK) or (outcome == SWALLOW_RETURN and not self.postgresql):
            return {Fate(PROCESSED, runs, parts)}
        if outcome == DB_AWAY:
            return self.fates(runs, failures=failures, parts=parts)
        if outcome in (COMMIT_RAISE, UNTRACED_RAISE):
            return {Fate(DEAD, runs, parts + 1, failures + 1)}
        if outcome == LISTEN_RETURN or (outcome == ROLLBACK_RETURN and self.postgresql):
            return {Fate(DEAD, runs, parts, failures + 1)}
        if outcome != DIE:
            return self._failed(runs, failures + 1, parts)
        # Counted when the message comes again, before its next run (so it may come again
        # to be dead-lettered at once); not if this run was on its first delivery.
        first = all(earlier == DB_AWAY for earlier in self.script[:run])
        found = self._failed(runs, failures + 1, parts)
        return found | self.fates(runs, failures=failures, parts=parts) if first else found

    def _failed(self, runs: int, failures: int, parts: int) -> set[Fate]:
        if failures >= self.max_attempts:
            return {Fate(DEAD, runs, parts, failures)}
        return self.fates(runs, failures=failures, parts=parts)
