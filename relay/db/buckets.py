"""The database side of owned buckets (``relay.buckets``): presence, bucket leases, hand-over.

One ``refresh`` per turn, in one transaction: the relay says it is alive for one more lease
(or, when it cannot publish, that it is not), counts the relays alive, renews the leases of
the buckets it still owns (a bucket whose owner is still this relay was taken by no one, even
if its lease ran out meanwhile), takes free or expired buckets up to its fair share and
gives up the buckets it hands over. Every time is the database's (``relay.db.clock``).

The claim then asks the database which buckets are this relay's, with enough of their lease
left (``owned_now``), in the claim's own statement: a relay that froze past its lease and
lost a bucket claims nothing from it on waking, whatever its own clock says.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, NamedTuple

import sqlalchemy as sa

from relay.buckets import Fence, fence, turn
from relay.constants import PROTOCOL, PROTOCOL_BEFORE_FENCES, PROTOCOL_RELEASE
from relay.db.clock import database_time
from relay.db.dialects import of
from relay.db.schema import outbox_buckets, outbox_protocol, outbox_relays


def owned_now(owner: str, margin: float = 0.0) -> sa.Select[tuple[int]]:
    """The buckets ``owner`` holds under a lease with more than ``margin`` seconds left."""
    return owned_by(owner).where(outbox_buckets.c.lease_until > database_time(margin))


def owned_by(owner: str) -> sa.Select[tuple[int]]:
    """The buckets whose owner is still ``owner``, its lease run out or not: no other relay
    took them, so none can hold their rows."""
    return sa.select(outbox_buckets.c.bucket).where(outbox_buckets.c.owner == owner)


class Admits(NamedTuple):
    """The least protocol the schema admits, and the first release that speaks it."""

    protocol: int
    release: str


# What a schema admits when it says nothing more (migration 0013's first row says the same).
EVERY_PROTOCOL = Admits(PROTOCOL_BEFORE_FENCES, "any release")


class Refreshed(NamedTuple):
    """A turn's outcome: the buckets to claim from, why none when another protocol's relays
    or the schema stand in the way (``relay.buckets.fence``), and what the schema admits."""

    claim_from: frozenset[int]
    fenced: Fence | None
    admits: Admits


def refresh(
    conn: sa.Connection,
    owner: str,
    lease: float,
    held: Collection[int],
    active: bool,
    *,
    protocol: int | None = PROTOCOL,
) -> Refreshed:
    """One turn for ``owner`` (of ``protocol``) holding the rows ``held``, able to publish or
    not (``active``); returns the buckets to claim from. Run it in a transaction, at least
    once every third of a lease. ``protocol=None`` turns as the releases before protocols
    did (for tests that stand in for them: no protocol said, none looked at).

    A relay fenced by another protocol's (``relay.buckets.fence``) turns as one that cannot
    publish: it claims nothing and gives up every bucket it holds no row of. It stays
    present for the other protocol's relays to see, but not counted among the relays (its
    presence runs out at once), so that their fair shares still cover the outbox.

    It never waits on another relay's turn: every row it changes that another relay may
    hold locked (a relay gone, a bucket of its own being taken) is locked with SKIP LOCKED,
    and a row skipped is left for the next turn. A relay frozen inside its turn would
    otherwise stall every other relay's turns, and so their claims, until the database
    ended its transaction."""
    fenced = None
    admits = EVERY_PROTOCOL  # read only where a fence is decided
    if active and protocol is not None:
        admits = _admits(conn)
        holding, announced, counted = _protocols(conn, owner, lease)
        fenced = fence(protocol, holding, announced, admits.protocol, counted)
        if fenced is None and protocol == PROTOCOL and admits.protocol < protocol:
            # The switch: no relay of an older protocol holds buckets, and this one takes
            # them. From here on the schema admits this protocol only, so that an older relay
            # still running (waiting, or frozen) retires at its next turn rather than take the
            # outbox back once the newer ones are gone: it would publish again ids they acked,
            # whose keys only their sent log holds (migration 0015). A stand-in of an older
            # release (another ``protocol``, in tests) raises nothing, as those did not.
            conn.execute(
                sa.update(outbox_protocol)
                .where(outbox_protocol.c.least_protocol < protocol)
                .values(least_protocol=protocol, least_release=PROTOCOL_RELEASE)
            )
    if active:
        _present(conn, owner, lease, protocol=protocol, until=0.0 if fenced else lease)
    publishing = active and fenced is None
    live = sa.select(sa.func.count()).where(outbox_relays.c.alive_until > database_time())
    relays = int(conn.execute(live).scalar_one())
    mine = sa.select(outbox_buckets.c.bucket).where(outbox_buckets.c.owner == owner)
    owned = _lease(conn, mine, lease)
    plan = turn(owned, relays, held, publishing)
    taken: set[int] = set()
    if plan.take:
        free = sa.or_(
            outbox_buckets.c.owner.is_(None), outbox_buckets.c.lease_until <= database_time()
        )
        take = sa.select(outbox_buckets.c.bucket).where(free)
        taken = _lease(conn, take.order_by(outbox_buckets.c.bucket).limit(plan.take), lease, owner)
    if plan.release:
        conn.execute(
            sa.update(outbox_buckets)
            .where(outbox_buckets.c.owner == owner, outbox_buckets.c.bucket.in_(plan.release))
            .values(owner=None, lease_until=None)
        )
    if not active:
        # Present while it holds buckets, and not counted: the fence counts bucket holders,
        # and takes one not present for a relay of a release before protocols (which leaves
        # the relays when it cannot publish, and keeps the buckets of the rows it holds).
        # Written after its buckets' leases, so that it is not forgotten while they last.
        keeps = protocol is not None and bool(owned - plan.release)
        _present(conn, owner, lease, protocol=protocol, until=0.0 if keeps else None)
    return Refreshed(plan.claim_from | taken, fenced, admits)


def _admits(conn: sa.Connection) -> Admits:
    """The schema's least protocol (migration 0013's row, raised by a migration that older
    relays cannot run beside)."""
    row = conn.execute(
        sa.select(outbox_protocol.c.least_protocol, outbox_protocol.c.least_release)
        .order_by(outbox_protocol.c.least_protocol.desc())
        .limit(1)
    ).one_or_none()
    return Admits(*row) if row else EVERY_PROTOCOL


def holders(protocol: sa.ColumnElement[Any] = outbox_relays.c.protocol) -> sa.Select[Any]:
    """The relays that hold buckets under a live lease, present or not: owner, protocol and
    buckets held. A holder's protocol is its presence's (``protocol``: that column, or NULL
    on a schema before protocols); a holder that says none, or is not present, is of a
    release before protocols, which leaves the relays when it cannot publish and keeps the
    buckets of the rows it holds (a relay of this release stays present while it holds
    any). The fence and ``relay migrate`` both count relays by it."""
    lease = outbox_buckets.c
    said = sa.func.coalesce(protocol, PROTOCOL_BEFORE_FENCES)
    return (
        sa.select(lease.owner, said, sa.func.count())
        .select_from(outbox_buckets.outerjoin(outbox_relays, lease.owner == outbox_relays.c.owner))
        .where(lease.owner.is_not(None), lease.lease_until > database_time())
        .group_by(lease.owner, said)
    )


def _protocols(
    conn: sa.Connection, owner: str, lease: float
) -> tuple[set[int], set[int], set[int]]:
    """``fence``'s view of the other relays: the protocols of those that hold buckets under
    a live lease (``holders``), of every one present (those waiting included: their
    presence ran out less than a lease ago), and of those counted among the relays (their
    presence runs now)."""
    relay = outbox_relays.c
    holding = {said for holder, said, _ in conn.execute(holders()) if holder != owner}
    said = sa.func.coalesce(relay.protocol, PROTOCOL_BEFORE_FENCES)
    present = conn.execute(
        sa.select(said, relay.alive_until > database_time())
        .distinct()
        .where(relay.owner != owner, relay.alive_until > database_time(-lease))
    ).all()
    return holding, {p for p, _ in present}, {p for p, now in present if now}


def _locked(conn: sa.Connection, keys: sa.Select[Any]) -> set[Any]:
    """The keys ``keys`` selects, their rows locked now by this transaction, less those
    another transaction holds locked (``SELECT ... FOR UPDATE SKIP LOCKED``; SQLite has one
    writer at a time, and no locks to skip)."""
    return set(conn.scalars(keys.with_for_update(skip_locked=True)))


def _lease(
    conn: sa.Connection, buckets: sa.Select[tuple[int]], lease: float, owner: str | None = None
) -> set[int]:
    """Lease the buckets ``buckets`` selects (to ``owner``, when given) for ``lease``
    seconds, skipping those another relay holds locked; returns them."""
    chosen = _locked(conn, buckets)
    if chosen:
        values: dict[str, Any] = {"lease_until": database_time(lease)}
        if owner is not None:
            values["owner"] = owner
        which = outbox_buckets.c.bucket.in_(chosen)
        conn.execute(sa.update(outbox_buckets).where(which).values(values))
    return chosen


def _present(
    conn: sa.Connection, owner: str, lease: float, *, protocol: int | None, until: float | None
) -> None:
    """``owner`` is present for ``until`` seconds more: counted among the relays for a
    lease, or, 0, seen but not counted (renewed each turn: waiting, or holding buckets while
    it cannot publish); or, None, is no more. Relays gone for a lease are forgotten (those
    another relay is forgetting now skipped)."""
    if until is not None:
        alive: dict[str, Any] = {"owner": owner, "alive_until": database_time(until)}
        if protocol is not None:
            alive["protocol"] = protocol
        renewed = {name: value for name, value in alive.items() if name != "owner"}
        conn.execute(of(conn).upsert(outbox_relays, alive, ["owner"], renewed))
    else:
        conn.execute(sa.delete(outbox_relays).where(outbox_relays.c.owner == owner))
    gone = sa.select(outbox_relays.c.owner).where(
        outbox_relays.c.alive_until < database_time(-lease)
    )
    if owners := _locked(conn, gone):
        conn.execute(sa.delete(outbox_relays).where(outbox_relays.c.owner.in_(owners)))
