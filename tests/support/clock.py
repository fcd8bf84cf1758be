"""A controlled clock for the loop's tests: an event loop on virtual time.

Time stands still while anything is ready to run (callbacks, I/O, a worker thread's result)
and jumps to the next timer when the loop would otherwise wait for it (the loop's own
``_ready`` and ``_scheduled`` queues say which: asyncio has no public way to ask). Sleeps, timeouts,
polls and back-offs then take no wall time, and a test sees the same timing on a loaded
machine as on an idle one. A store call in a worker thread (``asyncio.to_thread``) is waited
for in real time, however long a busy machine keeps it from running, and takes no virtual time:
a call that should look slow sleeps on the loop, not in its thread. (Letting the clock move on
after a real wait made the timing a test saw depend on the machine's load: a claim recorded
2 ms late under CI's load once broke a 50 ms linger's bound.)
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")

REAL_WAIT_S = 0.05  # how long one select waits for a worker thread before looking again


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0
        self._working = 0  # worker-thread calls under way
        real_select = self._selector.select  # type: ignore[attr-defined]

        def select(timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
            wait = REAL_WAIT_S if self._working else 0.0
            events: list[tuple[selectors.SelectorKey, int]] = real_select(
                wait if timeout is None else min(timeout, wait)
            )
            scheduled = self._scheduled  # type: ignore[attr-defined]
            if scheduled:
                due = scheduled[0].when()
                idle = not events and not self._ready and not self._working  # type: ignore[attr-defined]
                # Idle, nothing can happen before the next timer: its time has come. And a
                # timer within the clock's resolution runs now anyway (asyncio's rule): its
                # time must have come too, or code that waits for it sees no time pass.
                if idle or due <= self._now + self._clock_resolution:  # type: ignore[attr-defined]
                    self._now = max(self._now, due)
            return events

        self._selector.select = select  # type: ignore[attr-defined]

    def time(self) -> float:
        return self._now

    def run_in_executor(  # type: ignore[override]
        self, executor: Executor | None, func: Callable[..., T], *args: Any
    ) -> asyncio.Future[T]:
        future = super().run_in_executor(executor, func, *args)
        self._working += 1
        future.add_done_callback(self._worked)
        return future

    def _worked(self, _future: asyncio.Future[Any]) -> None:
        self._working -= 1


def loop_time() -> float:
    """The running loop's time; before a loop runs, a virtual loop's start (0)."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return 0.0


def run(main: Coroutine[Any, Any, T], loop: VirtualTimeLoop | None = None) -> T:
    """``asyncio.run`` on a virtual-time loop (``loop``, or a new one)."""
    with asyncio.Runner(loop_factory=lambda: loop or VirtualTimeLoop()) as runner:
        return runner.run(main)
