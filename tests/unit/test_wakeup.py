"""The loop's wake-up call (``relay.wakeup``), on the virtual-time loop."""

from __future__ import annotations

import asyncio

import pytest

from relay.wakeup import Wakeup
from tests.support.clock import loop_time, run


@pytest.mark.parametrize(
    ("set_at", "timeout", "returns", "after"),
    [
        (None, 1.0, False, 1.0),  # nobody sets it: the timeout
        (-1.0, 1.0, True, 0.0),  # set before the wait: at once
        (0.25, 1.0, True, 0.25),  # set during the wait: then
        (2.0, 1.0, False, 1.0),  # set after the timeout: the timeout
        (0.5, None, True, 0.5),  # no timeout: until set
    ],
)
def test_a_wait_returns_when_set_or_timed_out(
    set_at: float | None, timeout: float | None, returns: bool, after: float
) -> None:
    async def scenario() -> tuple[bool, float, bool]:
        wakeup = Wakeup()
        loop = asyncio.get_running_loop()
        if set_at is not None and set_at < 0:
            wakeup.set()
        elif set_at is not None:
            loop.call_later(set_at, wakeup.set)
        start = loop_time()
        was_set = await wakeup.wait(timeout)
        return was_set, loop_time() - start, wakeup.is_set()

    was_set, waited, still_set = run(scenario())
    assert (was_set, round(waited, 6)) == (returns, after)
    assert not still_set or set_at == 2.0, "the wait did not consume the call"


def test_a_call_during_one_wait_is_not_seen_by_the_next_and_clear_drops_one() -> None:
    async def scenario() -> list[bool]:
        wakeup = Wakeup()
        asyncio.get_running_loop().call_later(0.1, wakeup.set)
        seen = [await wakeup.wait(1.0), await wakeup.wait(0.2)]
        wakeup.set()
        wakeup.clear()
        seen.append(await wakeup.wait(0.2))
        return seen

    assert run(scenario()) == [True, False, False]


def test_a_cancelled_wait_leaves_nothing_behind() -> None:
    async def scenario() -> bool:
        wakeup = Wakeup()
        waiting = asyncio.create_task(wakeup.wait(10.0))
        await asyncio.sleep(0.1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        wakeup.set()  # no waiter left to wake: remembered for the next wait
        return await wakeup.wait(0.0)

    assert run(scenario())
