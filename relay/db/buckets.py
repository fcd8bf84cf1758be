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
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql, postgresql, sqlite

from relay.buckets import turn
from relay.db.clock import database_time
from relay.db.schema import outbox_buckets, outbox_relays


def owned_now(owner: str, margin: float = 0.0) -> sa.Select[tuple[int]]:
    """The buckets ``owner`` holds under a lease with more than ``margin`` seconds left."""
    return owned_by(owner).where(outbox_buckets.c.lease_until > database_time(margin))


def owned_by(owner: str) -> sa.Select[tuple[int]]:
    """The buckets whose owner is still ``owner``, its lease run out or not: no other relay
    took them, so none can hold their rows."""
    return sa.select(outbox_buckets.c.bucket).where(outbox_buckets.c.owner == owner)


def refresh(
    conn: sa.Connection, owner: str, lease: float, held: Collection[int], active: bool
) -> frozenset[int]:
    """One turn for ``owner`` holding the rows ``held``, able to publish or not
    (``active``); returns the buckets to claim from. Run it in a transaction, at least once
    every third of a lease.

    It never waits on another relay's turn: every row it changes that another relay may
    hold locked (a relay gone, a bucket of its own being taken) is locked with SKIP LOCKED,
    and a row skipped is left for the next turn. A relay frozen inside its turn would
    otherwise stall every other relay's turns, and so their claims, until the database
    ended its transaction."""
    _present(conn, owner, lease, active)
    live = sa.select(sa.func.count()).where(outbox_relays.c.alive_until > database_time())
    relays = int(conn.execute(live).scalar_one())
    mine = sa.select(outbox_buckets.c.bucket).where(outbox_buckets.c.owner == owner)
    owned = _lease(conn, mine, lease)
    plan = turn(owned, relays, held, active)
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
    return plan.claim_from | taken


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


def _present(conn: sa.Connection, owner: str, lease: float, active: bool) -> None:
    """``owner`` counts among the relays for one more lease, or no more; relays gone for a
    lease are forgotten (those another relay is forgetting now skipped)."""
    if active:
        alive = {"owner": owner, "alive_until": database_time(lease)}
        if conn.dialect.name == "mysql":
            mine = mysql.insert(outbox_relays).values(alive)
            conn.execute(mine.on_duplicate_key_update(alive_until=mine.inserted.alive_until))
        else:
            insert = postgresql.insert if conn.dialect.name == "postgresql" else sqlite.insert
            stmt = insert(outbox_relays).values(alive)
            conn.execute(
                stmt.on_conflict_do_update(
                    index_elements=[outbox_relays.c.owner],
                    set_={"alive_until": stmt.excluded.alive_until},
                )
            )
    else:
        conn.execute(sa.delete(outbox_relays).where(outbox_relays.c.owner == owner))
    gone = sa.select(outbox_relays.c.owner).where(
        outbox_relays.c.alive_until < database_time(-lease)
    )
    if owners := _locked(conn, gone):
        conn.execute(sa.delete(outbox_relays).where(outbox_relays.c.owner.in_(owners)))
