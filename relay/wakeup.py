"""A wake-up call between the loop's tasks: set by anyone on the event loop, waited for by one
task, for at most a timeout, and consumed by that wait. Pure asyncio: no I/O.

``asyncio.wait_for(event.wait(), timeout)`` wraps each wait in a task of its own, with its
own callbacks to schedule, cancel and chain: at a steady stream, where the loop's tasks wait
and wake a few hundred times a second, those waits were most of the event loop's callbacks
(one relay at 1,000 rows/s: about 100 ``wait_for`` calls and 600 callbacks a second). A wait
here is one future and one timer.
"""

from __future__ import annotations

import asyncio


class Wakeup:
    """An ``asyncio.Event`` for one waiter that ``wait`` clears as it returns."""

    __slots__ = ("_set", "_waiter")

    def __init__(self) -> None:
        self._set = False
        self._waiter: asyncio.Future[None] | None = None

    def set(self) -> None:
        self._set = True
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False

    async def wait(self, timeout: float | None = None) -> bool:
        """Until ``set`` was called (since the last wait returned), or ``timeout`` seconds
        passed; whether it was set. Either way it is clear again."""
        if not self._set:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = None if timeout is None else loop.call_later(timeout, _expire, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        was_set, self._set = self._set, False
        return was_set


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
