"""What the sent log's runs are written as (``relay.db.sentruns`` seals them,
``relay.db.sentmerge`` merges them): blocks of keys in key order, a run's row, and what a
step of their upkeep made."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from relay.db.schema import outbox_sent_blocks, outbox_sent_runs

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Made:
    """A run made: its level and entries."""

    level: int
    entries: int


@dataclass(frozen=True)
class Upkeep:
    """One step of the runs' upkeep: the runs it finished, and whether more is due at once
    (the rest of a long tail, a level-1 span at a time; a merge's next range of keys)."""

    made: tuple[Made, ...] = ()
    more: bool = False

    def __add__(self, other: Upkeep) -> Upkeep:
        return Upkeep(self.made + other.made, self.more or other.more)


def write_blocks(conn: sa.Connection, entries: sa.Select[Any], run: int, block: int) -> int:
    """``entries`` (``key``, ``sent_at``) as blocks of ``block`` keys of ``run``, in key
    order: of a key there twice, its latest entry. The entries written."""
    latest = entries.subquery("entries")
    distinct = (
        sa.select(latest.c.key, latest.c.sent_at)
        .ext(postgresql.distinct_on(latest.c.key))
        .order_by(latest.c.key, latest.c.sent_at.desc())
        .subquery("latest")
    )
    numbered = sa.select(
        distinct.c.key,
        distinct.c.sent_at,
        ((sa.func.row_number().over(order_by=distinct.c.key) - 1) // block).label("block"),
    ).subquery("numbered")
    keys = sa.func.array_agg(postgresql.aggregate_order_by(numbered.c.key, numbered.c.key))
    blocks: sa.Select[Any] = sa.select(
        sa.literal(run, sa.BigInteger()),
        keys[1],  # its first key (PostgreSQL 15 has no min() of uuids)
        keys,
        sa.func.array_agg(postgresql.aggregate_order_by(numbered.c.sent_at, numbered.c.key)),
    ).group_by(numbered.c.block)
    written = conn.execute(
        sa.insert(outbox_sent_blocks)
        .from_select(["run", "first_key", "message_keys", "sent_at"], blocks)
        .returning(sa.func.cardinality(outbox_sent_blocks.c.message_keys))
    ).scalars()
    return sum(written)


def finished(conn: sa.Connection, run: int, level: int, count: int) -> Made:
    """``run``, of ``level``, done: its count of entries, logged."""
    conn.execute(
        sa.update(outbox_sent_runs)
        .where(outbox_sent_runs.c.run == run)
        .values(entries=count, building=False)
    )
    log.info(
        "sent log entries sealed into a run",
        extra={"action": "sent_run", "level": level, "entries": count},
    )
    return Made(level, count)
