"""Which live relays stand in the way of a schema change (``relay migrate``). Pure: the
database side is ``relay.db.migrate``.

A migration says the least protocol of the relays that may run beside it (its module's
``least_protocol``; None: any, as for a migration that only adds). An upgrade through one
that says a protocol is refused while a live relay of an older protocol holds buckets: it
would publish under assumptions the schema no longer keeps. A downgrade is refused while
any live relay holds buckets: the relays of this release assume the schema it leaves.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class LiveRelay(NamedTuple):
    """A relay present in the outbox (its presence row, or buckets under a live lease)."""

    owner: str
    protocol: int  # the releases before protocols: 1 (``relay.constants``)
    buckets: int  # buckets it holds under a live lease


def least_protocol(steps: Iterable[int | None]) -> int | None:
    """The least protocol that relays running beside every one of ``steps`` (the revisions
    a migration runs, each's own least protocol) must speak; None when any will do."""
    said = [least for least in steps if least is not None]
    return max(said) if said else None


def blockers(live: Iterable[LiveRelay], least: int | None, downgrade: bool) -> list[LiveRelay]:
    """The relays in the way of a migration that needs relays of protocol ``least`` or later
    beside it (``downgrade``: one that moves the schema down)."""
    holding = [relay for relay in live if relay.buckets > 0]
    if downgrade:
        return holding
    if least is None:
        return []
    return [relay for relay in holding if relay.protocol < least]
