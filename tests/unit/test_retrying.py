"""The relay's database calls retried (``relay.retrying``): a call waiting out its back-off
tries again as soon as the database is reached, not when the back-off ends."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from relay.backoff import Backoff
from relay.errors import StoreError
from relay.metrics import Metrics
from relay.retrying import RetryingStore
from tests.support.fakes import InMemoryStore

# A back-off no test waits out: a call that returns sooner was woken.
LONG_BACKOFF_S = 600.0
WOKEN_WITHIN_S = 5.0


class Away(InMemoryStore):
    """A store whose database is away until told it is back."""

    def __init__(self) -> None:
        super().__init__()
        self.away = True
        self.tries = 0

    def hasten(self, exchanges: Sequence[str]) -> int:
        self.tries += 1
        if self.away:
            raise StoreError("connection refused")
        return super().hasten(exchanges)


def test_a_call_waiting_out_its_back_off_tries_again_once_the_database_is_reached() -> None:
    async def scenario() -> None:
        store = Away()
        retrying = RetryingStore(
            store, Backoff(LONG_BACKOFF_S, LONG_BACKOFF_S), Metrics(), lambda: None
        )
        call = asyncio.create_task(retrying.hasten(["ex"]))
        while store.tries < 2:  # its first try and the one at once after it failed
            await asyncio.sleep(0.01)
        store.away = False
        retrying.reached()  # as the sent log's look, or another call, reached it
        assert await asyncio.wait_for(call, WOKEN_WITHIN_S) == 0
        assert store.tries == 3

    asyncio.run(scenario())
