"""The store as the loop calls it: each call in a worker thread, retried until it works.

A database outage must not stop the relay, nor lose what it knows: a claim, settle, turn or
hasten that fails (``StoreError``) is tried again with back-off, until it works or, once the
relay is stopping, until its drain deadline. The database's health (a gauge, a counter, the
relay's readiness, one log line per outage) is known here, where every call passes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Collection, Sequence
from typing import TypeVar

import tenacity

from relay.backoff import Backoff, log_before_retry
from relay.buckets import Fence
from relay.errors import StoreError
from relay.metrics import Metrics
from relay.ports import Store
from relay.records import OutboxRow, SettleBatch

log = logging.getLogger(__name__)
T = TypeVar("T")

_log_database_retry = log_before_retry(log, "database call failed", "database_retry")


async def in_thread(call: Callable[[], T], on_cancel: Callable[[], None] = lambda: None) -> T:
    """Run a store call in a worker thread. If the awaiting task is cancelled (shutdown), call
    ``on_cancel`` (to ask a long call to stop early), then wait for the call to finish before
    passing the cancellation on: otherwise the store could be closed under a thread that
    still holds one of its connections. The loop's executor directly, not ``to_thread``,
    which wraps each call in a task of its own and copies the context (no store call
    reads one)."""
    future = asyncio.get_running_loop().run_in_executor(None, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        on_cancel()
        await asyncio.wait([future])
        if not future.cancelled():
            future.exception()  # mark it retrieved: nobody waits for the abandoned result
        raise


class RetryingStore:
    """``store``'s calls for the loop, awaitable and retried. ``beat`` is called while a
    retry waits (the relay is alive, only waiting); ``failed`` whenever a call fails (what
    the relay knew of the database may no longer hold); ``deadline`` (in ``clock``'s
    seconds) ends the retries: the loop sets it when it stops."""

    def __init__(
        self,
        store: Store,
        retry: Backoff,
        metrics: Metrics,
        beat: Callable[[], None],
        clock: Callable[[], float] = time.monotonic,
        *,
        failed: Callable[[], None] = lambda: None,
    ) -> None:
        self._store = store
        self._on_failure = failed
        self.clock = clock
        self._retry = retry
        self._metrics = metrics
        self._beat = beat
        self.deadline = float("inf")
        # The kinds of call failing now (each failed again after its retry at once), with
        # the last error of each; and whether a turn has worked yet (``problem``).
        self._failing: dict[str, str] = {}
        self._turned = False
        self._up = False  # said available (``relay_database_connected`` 1)
        # Counts the times the database was reached (``reached``): a call waiting out its
        # back-off tries again once it moves.
        self._reached = 0

    @property
    def problem(self) -> str | None:
        """Why the relay cannot work with its database now, or None. One kind of call
        failing is enough: a relay whose turns fail owns no part of the outbox, though its
        claims (of no bucket) work; and until a turn has worked it owns none yet."""
        for call, error in self._failing.items():
            return f"the database's {call}s fail: {error}"
        return None if self._turned else "no turn has worked yet: this relay owns no buckets"

    @property
    def fenced(self) -> Fence | None:
        """The store's own (``Store.fenced``): its last turn's."""
        return self._store.fenced

    async def claim(
        self,
        limit: int,
        max_bytes: int,
        first_always: bool,
        skip: Collection[str],
        settle_first: SettleBatch | None = None,
    ) -> list[OutboxRow]:
        """The store's claim; with ``settle_first``, those outcomes are recorded before it, in
        the same call to the worker thread (a retry records them again: a settle written
        twice changes nothing more)."""
        store = self._store

        def call() -> list[OutboxRow]:
            if settle_first:
                store.settle(settle_first)
            return store.claim(limit, max_bytes, first_always, skip)

        return await self._call("claim", call)

    async def settle(self, batch: SettleBatch) -> None:
        await self._call("settle", functools.partial(self._store.settle, batch))

    async def turn(self, active: bool) -> float:
        """The store's turn; returns when its buckets' lease ends on ``clock``: the seconds
        it leased them for, from the start of the attempt that worked (``relay.lease``)."""
        turn = functools.partial(self._store.turn, active)
        seconds, asked_at = await self._attempts("turn", turn)
        self._turned = True
        return asked_at + seconds

    def may_hold(self, first: int, last: int) -> bool:
        """The store's own (no I/O: not retried)."""
        return self._store.may_hold(first, last)

    async def hasten(self, exchanges: Sequence[str]) -> int:
        return await self._call("hasten", functools.partial(self._store.hasten, exchanges))

    async def _call(self, name: str, call: Callable[[], T]) -> T:
        result, _ = await self._attempts(name, call)
        return result

    async def _attempts(self, name: str, call: Callable[[], T]) -> tuple[T, float]:
        """``call``'s result, and the clock's reading when the attempt that worked began.

        The first attempt is made before tenacity's loop is set up (which cost about as much
        as a small claim's own Python work, at every claim and settle of a live stream). If
        it fails, it is counted, and tenacity's loop tries again at once (a connection the
        database dropped is replaced by then), then with back-off, logging each failure."""
        began = self.clock()
        try:
            result = await in_thread(call)
        except StoreError:
            self._metrics.store_errors.inc()
            self._on_failure()
        else:
            self._worked(name)
            return result, began
        retrying = tenacity.AsyncRetrying(
            wait=self._retry.wait,
            retry=tenacity.retry_if_exception_type(StoreError),
            stop=lambda _state: self.clock() >= self.deadline,
            sleep=self._sleep,
            before_sleep=functools.partial(self._failed, name),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                began = self.clock()
                result = await in_thread(call)
        self._worked(name)
        return result, began

    def reached(self) -> None:
        """The database answered a call (this store's, or another part's of the relay): the
        calls waiting to try it again try at once, within a second, rather than wait out a
        back-off that grew while it was away (up to ``RELAY_RECONNECT_MAX``: an outside
        review saw claims wait 28 s after PostgreSQL came back)."""
        self._reached += 1

    def _worked(self, name: str) -> None:
        """A ``name`` call worked: once no kind of call fails, the database is available
        (said once, not whenever some other kind of call works while one still fails)."""
        self.reached()
        self._failing.pop(name, None)
        if not self._up and not self._failing:
            self._available()

    def _available(self) -> None:
        self._up = True
        self._metrics.database_connected.set(1)
        log.info("database available", extra={"action": "database_connected"})

    async def _sleep(self, seconds: float) -> None:
        """tenacity's sleep, cut short at the deadline so SIGTERM is never stuck, and once
        the database is reached."""
        end, reached = self.clock() + seconds, self._reached
        while (now := self.clock()) < min(end, self.deadline) and self._reached == reached:
            self._beat()
            await asyncio.sleep(min(1.0, end - now))

    def _failed(self, name: str, state: tenacity.RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        self._failing[name] = str(error)
        self._up = False
        self._metrics.database_connected.set(0)
        self._metrics.store_errors.inc()
        self._on_failure()
        _log_database_retry(state)
