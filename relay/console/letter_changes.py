"""The console's changes of an inbox queue's dead letters, behind ``relay.console.changes``'
confirm and act: requeue (an operator's: back to their queue, their failed attempts
forgotten, as ``relay inbox requeue`` does, by its own code) and purge (an admin's: taken
from the queue). Either takes the letters ticked on a page (named by their digest, whatever
their key), those whose reason holds a text, or all; its done page and audit entry account
for every letter: moved, left and why, or not read (another reader held it)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from relay.admin.inbox import requeue
from relay.broker.deadletter_pages import tally
from relay.broker.deadletters import DeadLetter, Moved, MoveFailed, move_letters
from relay.console import forms
from relay.console.access import Refused
from relay.console.letters import BOUNDS, inbox_queue, on_queue
from relay.console.state import Console
from relay.console_records import ADMIN, Actor
from relay.db.console_audit_log import PURGE, REQUEUE, failed
from relay.errors import InputError

LETTER_ACTIONS = (REQUEUE, PURGE)
SCOPES = ("letters", "reason", "all")
# Letters a done page names of those left, and the audit of those left for each reason
# (the count says the rest: the result column is TEXT, 64 KB on MySQL).
_LEFT_SHOWN = 100


class LetterChange:
    """A change of dead letters as its form asks for it."""

    def __init__(self, console: Console, fields: Mapping[str, str], letters: Sequence[str]) -> None:
        self.action = fields.get("action", "")
        self.queue = inbox_queue(console, fields.get("queue", ""))
        self.scope = fields.get("scope") or "letters"
        if self.scope not in SCOPES:
            raise InputError("scope: not one of " + ", ".join(SCOPES))
        self.reason = forms.text(fields, "reason") if self.scope == "reason" else ""
        self.digests = (
            {forms.letter_digest(v) for v in letters} if self.scope == "letters" else set()
        )
        if self.scope == "letters" and not self.digests:
            raise InputError("no dead letters chosen")
        if self.scope == "reason" and not self.reason:
            raise InputError("reason: say which text the letters' reason holds")
        # By reason or all: as many letters from the queue's head as it held when the change
        # was confirmed (its confirmation posts them); those after came later, and are left.
        self.most: int | None = None
        if self.scope != "letters" and fields.get("depth", "") != "":
            self.most = forms.count(fields, "depth")

    def allowed(self, actor: Actor) -> None:
        """A purge is an admin's (a requeue, an operator's: ``changes`` checks that)."""
        if self.action == PURGE and not actor.may(ADMIN):
            raise Refused(403, f"a purge needs the admin role; {actor.name} is a {actor.role}")

    def chosen(self) -> Callable[[DeadLetter], bool]:
        if self.scope == "letters":
            return lambda letter: letter.digest in self.digests
        if self.scope == "reason":
            return lambda letter: self.reason in letter.error
        return lambda _letter: True

    def target(self) -> str:
        """The audit's target: the queue and which letters (their digests, or the reason)."""
        which: dict[str, Any] = {"queue": self.queue, "scope": self.scope}
        if self.scope == "letters":
            which["letters"] = sorted(self.digests)
        elif self.scope == "reason":
            which["reason"] = self.reason
        return json.dumps(which)


def confirming(console: Console, change: LetterChange) -> dict[str, Any]:
    """What the confirmation shows: the letters chosen, or those a bounded read finds its
    reason (or all) to match, counted."""
    if change.scope == "letters":
        return {"change": change, "tally": None}
    counted = on_queue(console, change.queue, tally, choose=change.chosen(), bounds=BOUNDS)
    if counted.unreadable:
        raise InputError(f"{change.queue}'s dead letters are not read here: {counted.unreadable}")
    return {"change": change, "tally": counted}


def acting(console: Console, change: LetterChange, actor: Actor) -> dict[str, Any]:
    """The change made and audited; what the done page shows."""
    target = change.target()
    try:
        if change.action == REQUEUE:
            with console.dead_letter_lock(change.queue):
                done = requeue(
                    console.settings,
                    change.queue,
                    change.chosen(),
                    readable_only=True,
                    most=change.most,
                )
        else:
            done = on_queue(
                console,
                change.queue,
                move_letters,
                choose=change.chosen(),
                publish=False,
                readable_only=True,
                most=change.most,
            )
    except MoveFailed as exc:
        result = f"failed after {len(exc.moved)}: {type(exc.cause).__name__}"
        console.actions.record(actor, change.action, target, len(exc.moved), result)
        raise Refused(502, f"the broker refused a letter: {len(exc.moved)} moved first") from exc
    except Exception as exc:
        console.actions.record(actor, change.action, target, 0, failed(0, exc))
        raise
    unread = max(0, done.depth - done.later - done.read)
    console.actions.record(actor, change.action, target, len(done.moved), _result(done, unread))
    return {
        "change": change,
        "done": done,
        "left": [(_named(letter), why) for letter, why in done.left[:_LEFT_SHOWN]],
        "unread": unread,
    }


def _result(done: Moved, unread: int) -> str:
    """The audit's result: what moved, what was left and why, what was not read."""
    parts = [f"done: {len(done.moved)} of the {done.read} letters read"]
    whys: dict[str, list[str]] = {}
    for letter, why in done.left:
        whys.setdefault(why, []).append(letter.digest)
    for why, digests in whys.items():
        more = f" and {len(digests) - _LEFT_SHOWN} more" if len(digests) > _LEFT_SHOWN else ""
        parts.append(f"left {len(digests)} ({why}): {' '.join(digests[:_LEFT_SHOWN])}{more}")
    if done.later:
        parts.append(f"left {done.later} that came after the confirmation, not read")
    if unread:
        parts.append(f"not read {unread} (another reader held them)")
    return "; ".join(parts)


def _named(letter: DeadLetter) -> str:
    return letter.key or letter.message_id or f"(no key) {letter.digest}"
