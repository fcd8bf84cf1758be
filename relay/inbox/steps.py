"""The steps an inbox's flow (``relay.inbox.flow``) yields, what does them, and the drivers
that run a flow: a ``Step`` is a statement in a transaction of its own, or a move of the
message's own transaction (open it with the key, run the handler, a statement in it,
commit, roll back); a ``Doer`` does each (``relay.db.inbox.InboxStore`` and its asyncio
twin), and ``drive`` and ``drive_async`` send its answers back into the flow, the blocking
one called, the asyncio one awaited."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from relay.errors import StoreError


@dataclass(frozen=True, slots=True)
class Step:
    """What the flow needs done: ``Doer``'s method ``method`` called with ``args``; ``what``
    names it in an error."""

    method: str
    what: str
    args: tuple[Any, ...] = ()


def call(what: str, statement: Callable[..., Any], *args: Any) -> Step:
    """One of ``InboxStatements``, in a transaction of its own."""
    return Step("call", what, (what, statement, *args))


def in_transaction(what: str, statement: Callable[..., Any], *args: Any) -> Step:
    """One of ``InboxStatements``, in the message's open transaction."""
    return Step("execute", what, (what, statement, *args))


def open_with(key: str) -> Step:
    return Step("open", "the inbox's transaction", (key,))


HANDLE = Step("handle", "the handler")
COMMIT = Step("commit", "the inbox's commit")


LOOK_AT_TRANSACTION = Step("went_on", "looking at the message's transaction")


def roll_back(discard: bool = False) -> Step:
    return Step("rollback", "the inbox's rollback", (discard,))


class Doer(Protocol):
    """What does the flow's steps: the blocking one as here, the asyncio one awaited. Each
    raises StoreError when the database fails it (``TransactionFailed`` where the message's
    own transaction failed with the connection alive)."""

    def call(self, what: str, statement: Callable[..., Any], *args: Any) -> Any:
        """A statement in a transaction of its own."""

    def open(self, key: str) -> bool:
        """Begin the message's transaction with its key's insert: whether it went in (else
        the message was processed before, and the transaction holds nothing)."""

    def handle(self) -> Exception | None:
        """Run the handler in the open transaction: its exception, or None. StoreError when
        the inbox's connection was lost under it."""

    def execute(self, what: str, statement: Callable[..., Any], *args: Any) -> Any:
        """A statement in the open transaction."""

    def went_on(self) -> bool:
        """After the handler, the key not committed: whether the message's transaction ended
        under the handler and its connection ran on after it, so that a part of the work may
        have been committed past it."""

    def commit(self) -> None: ...

    def rollback(self, discard: bool) -> bool:
        """Roll back whatever is open (never raises); ``discard``: the connection's session
        may have been changed by the handler, and is not used again. Whether the rollback of
        a handler's run left a part of its work in place (``Dialect.rolled_back_in_part``)."""


R = TypeVar("R")
Steps = Generator[Step, Any, R]


def drive(steps: Steps[R], doer: Any) -> R:
    """Run ``steps`` to their answer, each done by ``doer`` (``Doer``; its StoreError thrown
    back in)."""
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
            reply = getattr(doer, step.method)(*step.args)
        except StoreError as exc:
            error = exc


async def drive_async(steps: Steps[R], doer: Any) -> R:
    """``drive`` for a ``doer`` whose methods are awaited."""
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
            reply = await getattr(doer, step.method)(*step.args)
        except StoreError as exc:
            error = exc
