"""The inbox against its reference model (``tests.support.inbox_model``), through its three
front ends at once, on the real broker and database: a rule-based state machine publishes
messages whose handler runs return, raise, fail on a unique key, die inside (SIGKILL), end
the transaction by each door, swallow an error, lose their ack, or lose the database under
them; it restarts the consumers (their prefetched deliveries go back) and makes the dead
letters' queues refuse publishes; and at each settling, every message at every front end
must have met a fate the model allows (processed once, or dead-lettered after the maximum
of real failures with that count, never both, never lost; the handler run exactly as often
as the script says), with no card number (the payload's, a statement's parameter, the
handler's message) in a dead letter, an attempt or a log. Every front end is held to the
same model with the same sequence: a differential test.

``MODEL_EXAMPLES`` sets how many sequences each database runs (two in the suite, each of up
to ten steps over the three front ends; shrinking is left to a deeper run by hand:
``MODEL_EXAMPLES=40 MODEL_SHRINK=1``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, precondition, rule, run_state_machine_as_test

from devtools.servers import RabbitNode
from tests.model.harness import MAX_ATTEMPTS, FrontEnd, Inboxes, databases, kill, processed, until
from tests.support.inbox_model import (
    COMMIT_RAISE,
    DB_AWAY,
    DDL_COMMIT,
    DEAD,
    DOOR_RETURN,
    LISTEN_RETURN,
    OUTCOMES,
    PROCESSED,
    RAISE,
    ROLLBACK_RETURN,
    SQL_COMMIT,
    UNTRACED_RAISE,
    Fate,
    fates,
)
from tests.support.rabbitmq import RABBITMQ_3, rabbit_node, running

EXAMPLES = int(os.environ.get("MODEL_EXAMPLES", "2"))
SHRINK = os.environ.get("MODEL_SHRINK") == "1"
STEPS = 10
# Bounds for a settling, each a deadline for an inbox that lost its way, not a window: a
# message's fate takes its retries' delays and the back-offs, well under a second each.
SETTLE_S = 20.0
SETTLE_PER_MESSAGE_S = 5.0
# The stream the consumers are killed under, and how often each is killed.
STREAM = 600
KILLS = 3

pytestmark = [pytest.mark.databases("postgresql", "sqlite"), pytest.mark.timeout(1200)]


Make = Callable[..., contextlib.AbstractContextManager[Inboxes]]


def machine(make: Make, postgresql: bool, away: bool) -> type[RuleBasedStateMachine]:
    """The state machine over front ends ``make`` gives afresh for each sequence, on
    PostgreSQL or SQLite (``fates``), a database that can be cut away (a server) or not."""
    outcomes = [o for o in OUTCOMES if away or o != DB_AWAY]

    class InboxModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.stack = contextlib.ExitStack()
            self.inboxes = self.stack.enter_context(make())
            self.fates: dict[str, set[Fate]] = {}

        @rule(script=st.lists(st.sampled_from(outcomes), max_size=4))
        def publish(self, script: list[str]) -> None:
            (key,) = self.inboxes.publish(script)
            self.fates[key] = fates(script, MAX_ATTEMPTS, postgresql)

        @rule()
        def restart_the_consumers(self) -> None:
            self.inboxes.restart()

        @precondition(lambda self: self.inboxes.refusing is None)
        @rule()
        def refuse_dead_letters(self) -> None:
            self.settle()  # no dead letter on its way: the limit is what the queues hold
            self.inboxes.refuse_dead_letters()

        @precondition(lambda self: self.inboxes.refusing is not None)
        @rule()
        def accept_dead_letters(self) -> None:
            self.inboxes.accept_dead_letters()

        @rule()
        def settle(self) -> None:
            self.settled(held=False)

        def settled(self, held: bool) -> None:
            self.inboxes.accept_dead_letters()
            check(self.inboxes, self.fates, held)
            scripts = [script for script, _card in self.inboxes.published.values()]
            restarts = {f.flavour: f.restarts for f in self.inboxes.front_ends}
            print(f"settled: {len(scripts)} messages {scripts}, consumers died {restarts}")

        def teardown(self) -> None:
            try:
                self.settled(held=True)  # what consumers hold too, once (the broker's CLI)
            finally:
                self.stack.close()

    return InboxModel


def check(inboxes: Inboxes, expected: dict[str, set[Fate]], held: bool = False) -> None:
    """Once every message met its fate at every front end and their queues are empty (with
    ``held``, of what consumers hold too): each fate is one the model allows, and nothing
    recorded quotes a card number."""
    bound = SETTLE_S + SETTLE_PER_MESSAGE_S * len(expected)
    try:
        for front_end in inboxes.front_ends:
            every_fate = functools.partial(inboxes.settled, front_end, expected)
            until(every_fate, bound, f"{front_end.flavour}: every fate")
        until(lambda: not inboxes.left(held), bound, "the front ends' queues empty")
    except AssertionError as exc:
        report = f"{exc}; left: {inboxes.left(held)}; published: {inboxes.published}"
        for front_end in inboxes.front_ends:
            letters = front_end.letters()
            everything = {key: front_end.seen(key, letters) for key in expected}
            tail = "\n".join(front_end.log().splitlines()[-30:])
            report += f"\n{front_end.flavour} saw {everything}; its log ends:\n{tail}"
        print(report)  # Hypothesis runs a failure again, which may fail otherwise
        raise AssertionError(report) from None
    for front_end in inboxes.front_ends:
        verify(inboxes, front_end, expected)


def verify(inboxes: Inboxes, front_end: FrontEnd, expected: dict[str, set[Fate]]) -> None:
    """Each message's fate at ``front_end`` is one the model allows; no card number in what
    it recorded."""
    name = front_end.flavour
    letters = front_end.letters()
    problems = []
    for key, allowed in expected.items():
        seen = front_end.seen(key, letters)
        if seen.full == 1 and not seen.letters:
            fate = Fate(PROCESSED, seen.runs, seen.parts)
        elif seen.full == 0 and len(seen.letters) == 1:
            fate = Fate(DEAD, seen.runs, seen.parts, seen.letters[0].attempts)
        else:
            fate = Fate(f"{seen.full} effects, {len(seen.letters)} letters", seen.runs, seen.parts)
        script, card = inboxes.published[key]
        if seen.full + seen.parts > 1:
            problems.append(f"{name} {key} {script}: its effects more than once: {fate}")
        if fate not in allowed:
            problems.append(f"{name} {key} {script}: {fate}, the model allows {allowed}")
        recorded = [seen.last_error or "", *(letter.error for letter in seen.letters)]
        if any(card in text for text in recorded):
            problems.append(f"{name} {key}: its card number recorded: {recorded}")
    log = front_end.log()
    problems += [
        f"{name}: {key}'s card number in its log"
        for key, (_script, card) in inboxes.published.items()
        if card in log
    ]
    if problems:
        print("\n".join(problems))  # Hypothesis runs a failure again, which may fail otherwise
    assert problems == [], "\n".join(problems)


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    """The model's own 3.10 node, with the management API its dead-letter steps set their
    policies through (``Inboxes.refuse_dead_letters``)."""
    yield from running(rabbit_node(RABBITMQ_3, tmp_path_factory, "model", management=True))


@pytest.fixture
def front_ends(database_url: str, rabbit: RabbitNode, tmp_path: Path) -> tuple[Make, bool, bool]:
    """A factory of the three front ends over fresh queues, for each sequence."""
    sqlite = database_url.startswith("sqlite")
    counter = iter(range(10**6))

    @contextlib.contextmanager
    def make(max_attempts: int = MAX_ATTEMPTS) -> Iterator[Inboxes]:
        root = tmp_path / f"sequence-{next(counter)}"
        root.mkdir()
        urls = databases("sqlite" if sqlite else "postgresql", database_url, root)
        with Inboxes(rabbit, urls, root, max_attempts).running() as inboxes:
            yield inboxes

    return make, not sqlite, not sqlite


def test_every_front_end_keeps_the_models_promises(front_ends: tuple[Make, bool, bool]) -> None:
    make, postgresql, away = front_ends
    run_state_machine_as_test(
        machine(make, postgresql, away),
        settings=settings(
            max_examples=EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            phases=list(Phase) if SHRINK else [Phase.explicit, Phase.reuse, Phase.generate],
            suppress_health_check=list(HealthCheck),
        ),
    )


def test_every_front_end_meets_the_doors_fates(front_ends: tuple[Make, bool, bool]) -> None:
    """One sequence of the machine's, always the same: the doors a handler may try (issue
    71's DDL, the connection's commit behind ``tx``, SQL text; the driver's commit, past the
    guard, then a raise; the driver's rollback; a listener left on the connection; the
    driver's trace callback replaced, then a part committed past its rollback), each message's
    effects at most once at every front end."""
    make, postgresql, away = front_ends
    model: Any = machine(make, postgresql, away)()  # its rules called as the machine would
    try:
        for script in (
            [COMMIT_RAISE],
            [DDL_COMMIT],
            [DOOR_RETURN, DDL_COMMIT],
            [SQL_COMMIT, RAISE, COMMIT_RAISE],
            [ROLLBACK_RETURN, DDL_COMMIT],
            [LISTEN_RETURN],
            [UNTRACED_RAISE],
        ):
            model.publish(script)
        model.settle()
    finally:
        model.teardown()


def test_consumers_killed_anywhere_under_a_stream_dead_letter_nothing(
    front_ends: tuple[Make, bool, bool],
) -> None:
    """Each front end SIGKILLed three times, wherever it is, under 600 messages whose handler
    never fails, with an allowance of two failures: a kill inside a run is that run's only
    failure (a message is not killed twice inside its runs, but by a rare chance), and
    deliveries that never reached their handler (prefetched, or held by FastStream) count
    nothing. Nothing dead-lettered, each message processed once. (FastStream dead-lettered
    90 of 600 so, 83 of which had never reached the handler.)"""
    make, _postgresql, _away = front_ends
    chunk = STREAM // (KILLS + 1)
    with make(max_attempts=2) as inboxes:
        keys: list[str] = []
        for _kill in range(KILLS):
            # Killed halfway through a chunk: deliveries in hand, prefetched, held.
            keys += inboxes.publish(*([[]] * chunk))
            for front_end in inboxes.front_ends:
                until(
                    functools.partial(processed_at_least, front_end, len(keys) - chunk // 2),
                    SETTLE_S + SETTLE_PER_MESSAGE_S * chunk,
                    f"{front_end.flavour}: half of a chunk processed",
                )
                kill(front_end)
        keys += inboxes.publish(*([[]] * (STREAM - len(keys))))
        # A run a kill cut off, and the one that processed it.
        expected = {key: {Fate(PROCESSED, 1, 0), Fate(PROCESSED, 2, 0)} for key in keys}
        check(inboxes, expected, held=True)
        for front_end in inboxes.front_ends:
            assert front_end.letters() == []
            assert front_end.restarts >= KILLS


def processed_at_least(front_end: FrontEnd, count: int) -> bool:
    return processed(front_end) >= count
