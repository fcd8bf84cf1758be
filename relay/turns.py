"""The relay's turns: its share of the outbox kept under a lease (``Store.turn``), and the
protocol fence a migration raises. A task of the relay loop (``relay.relay``).

A turn renews this relay's buckets' lease, hands its idle buckets to the others when it cannot
publish, takes a fair share of the free ones, and reads the least protocol the schema admits
(``relay.db.buckets``). Turns come every ``interval``, and at once when the relay became able
or unable to publish (``check``), so that a relay whose broker went away hands its idle
buckets to the others. A failed turn is retried as every database call is
(``relay.retrying``). While the lease has less than its margin left, nothing is claimed and
nothing published (``relay.lease``): ``holds`` says so, and logs it once each time it runs
short. A relay the schema retired (its protocol too old: ``RetiredError``, its idle buckets
given up) is stopped; the loop drains and raises the error (``retired``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from relay.errors import RetiredError
from relay.lease import Lease
from relay.metrics import Metrics
from relay.retrying import RetryingStore
from relay.wakeup import Wakeup

log = logging.getLogger(__name__)


class Turns:
    def __init__(
        self,
        store: RetryingStore,
        lease: Lease,
        metrics: Metrics,
        interval: float,
        *,
        turned: Callable[[], None],
        retire: Callable[[], None],
    ) -> None:
        self.store = store
        self.lease = lease
        self.metrics = metrics
        self.interval = interval
        self._turned = turned  # after every turn: the buckets it took may hold due rows
        self._retire = retire  # the schema retired this relay: stop it
        self._active = False  # what the last turn said: this relay can publish
        self._wanted = Wakeup()
        self._short = False  # the lease ran short, and that was logged
        self.retired: RetiredError | None = None

    def check(self, can_publish: bool) -> None:
        """A turn at once if the relay became able or unable to publish since the last."""
        if can_publish != self._active:
            self._wanted.set()

    def holds(self) -> bool:
        """The lease holds: rows may be published now (``Lease.holds``)."""
        holds = self.lease.holds()
        if not holds and not self._short:
            log.warning(
                "the lease of this relay's buckets has %.1f s left, less than the %.1f s a "
                "publish may take: not publishing until a turn renews it",
                self.lease.left(),
                self.lease.margin,
                extra={"action": "lease_short"},
            )
        self._short = not holds
        return holds

    async def run(self, can_publish: Callable[[], bool]) -> None:
        """Turn every ``interval`` and when ``check`` asks, until the schema retires this
        relay."""
        while True:
            self._wanted.clear()
            active = can_publish()
            try:
                self.lease.renewed(await self.store.turn(active))
            except RetiredError as exc:
                self.metrics.fenced.set(1)
                self.retired = exc
                self._retire()
                return
            self.metrics.fenced.set(0 if self.store.fenced is None else 1)
            self._active = active
            self._turned()
            await self._wanted.wait(self.interval)
