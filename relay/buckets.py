"""Which buckets of the outbox a relay claims from: a fair share, handed over without
publishing a row twice. Pure: the database side is ``relay.db.buckets``.

Every row lies in one bucket (``bucket_of``: runs of ``BUCKET_SPAN_ROWS`` consecutive ids,
each run ``BUCKET_STRIDE`` buckets on from the one before, round the ``OUTBOX_BUCKETS``
buckets: a stream of new ids is spread over every relay within a second). A relay owns
buckets under a lease it renews, and claims only from its own: two relays never hold the
same row, with no row written to say so.
Each turn (``turn``) a relay learns how many relays are alive and aims at its fair share. A
relay with fewer takes free buckets; one with more stops claiming from its highest ones and
gives each up once none of its rows is still held (claimed, not yet settled), so the next
owner cannot publish a row this relay has in flight. A relay that cannot publish (its
broker is away) is not counted among the relays and gives up every bucket it holds no row
of: the others take them, instead of that share of the outbox waiting for its broker. A
relay that dies keeps its buckets until their lease runs out, as it kept its rows' leases
before.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Iterable
from dataclasses import dataclass

from relay.constants import BUCKET_SPAN_ROWS, BUCKET_STRIDE, OUTBOX_BUCKETS
from relay.errors import RetiredError


def bucket_of(row_id: int) -> int:
    """The bucket of the row with this id (the same expression as the claim's SQL)."""
    return (row_id // BUCKET_SPAN_ROWS * BUCKET_STRIDE) % OUTBOX_BUCKETS


def any_in(first: int, last: int, buckets: Collection[int]) -> bool:
    """Whether a row with an id from ``first`` to ``last`` lies in one of ``buckets``: the
    probe of new rows says the newest id moved on, and a relay claims only for rows of its
    own buckets. (``OUTBOX_BUCKETS`` runs in a row cover every bucket: the stride and the
    count share no factor.)"""
    runs = range(first // BUCKET_SPAN_ROWS, last // BUCKET_SPAN_ROWS + 1)
    if len(runs) >= OUTBOX_BUCKETS:
        return bool(buckets)
    return any(run * BUCKET_STRIDE % OUTBOX_BUCKETS in buckets for run in runs)


def fair_share(relays: int) -> int:
    """Buckets each of ``relays`` live relays may own: every bucket owned when all take
    theirs (rounded up: the last relay gets the rest)."""
    return -(-OUTBOX_BUCKETS // max(1, relays))


@dataclass(frozen=True)
class Turn:
    """What a relay does with its buckets this turn."""

    take: int  # free (or expired) buckets to take, at most
    claim_from: frozenset[int]  # owned buckets to claim from
    release: frozenset[int]  # owned buckets to give up now: none of their rows is held


def turn(owned: Iterable[int], relays: int, held: Iterable[int], active: bool = True) -> Turn:
    """The turn of a relay that owns ``owned``, among ``relays`` live relays (itself
    included when ``active``), holding the rows with ids ``held``; an inactive relay (it
    cannot publish now) claims nothing and keeps only the buckets of its held rows."""
    mine = sorted(set(owned))
    busy = {bucket_of(i) for i in held}
    if not active:
        return Turn(take=0, claim_from=frozenset(), release=frozenset(mine) - busy)
    share = fair_share(relays)
    keep, excess = frozenset(mine[:share]), frozenset(mine[share:])
    return Turn(take=max(0, share - len(mine)), claim_from=keep, release=excess - busy)


class Fence(enum.Enum):
    """Why a relay takes no bucket this turn though it could publish (``fence``)."""

    WAIT_FOR_OLDER = "wait_for_older"  # live relays of an older protocol hold buckets
    YIELD_TO_NEWER = "yield_to_newer"  # a relay of a newer protocol is there
    RETIRED = "retired"  # the schema admits relays of a newer protocol only: stop


def fence(
    mine: int,
    holding: Iterable[int],
    announced: Iterable[int],
    least: int = 1,
    counted: Iterable[int] = (),
) -> Fence | None:
    """Whether a relay of protocol ``mine`` must stand aside this turn, seeing the other live
    relays' protocols: of those that hold buckets (``holding``), of every one present
    (``announced``: waiting ones included) and of those counted among the relays, there to
    take their fair share (``counted``); and the least protocol the schema admits
    (``least``: a migration older relays cannot run beside raises it). Relays of two
    protocols never own buckets at once: an older relay gives its buckets up as soon as a
    newer one is there; a newer one takes none while an older one holds any or is counted
    (one of a release before protocols takes its share of the free buckets whatever it
    sees, and never gives them up: the newer gives its own up at once rather than hand
    that share over, and waits for it to stop, and its leases to run out; one that knows
    fences stops being counted as soon as it sees the newer). A relay the schema no longer
    admits is retired: it gives its buckets up and stops, whoever else is there."""
    if mine < least:
        return Fence.RETIRED
    if any(other > mine for other in (*holding, *announced)):
        return Fence.YIELD_TO_NEWER
    if any(other < mine for other in (*holding, *counted)):
        return Fence.WAIT_FOR_OLDER
    return None


def retired(mine: int | None, least: int, release: str) -> RetiredError:
    """What a relay of protocol ``mine`` says when the schema admits relays of protocol
    ``least`` (first spoken by ``release``) or later only (``Fence.RETIRED``)."""
    return RetiredError(
        f"the outbox schema admits relays of protocol {least} or later ({release} or later); "
        f"this relay speaks protocol {mine}: run {release} or later"
    )
