"""What a handler leaves listening on the inbox's connection (``kept_off``): SQLAlchemy's event
listeners it added through a result's ``context.root_connection`` to that connection, its
engine, its pool or its dialect run at the inbox's own commit, rollback or release, after the
guard and its look at the key. One that rolled back through the driver at the commit had the
message acked with nothing committed; one that committed at the rollback had a failed run's
work committed at each attempt. They are taken off as the handler's run ends, before the
inbox sends anything more, and the run is refused (``ListenersLeft``).

SQLAlchemy has no public way to list what was listened for on an instance, nor to take off
a listener it stored wrapped (``event.remove`` wants the function as it was given): its
registry of listeners (``sqlalchemy.event.registry``), which ``event.remove`` itself works
from, is read and changed here: its keys' references copied before each run and compared by
identity after it (some microseconds a run). A listener on SQLAlchemy's classes themselves
(``event.listen(sa.Engine, ...)``), the process's every engine's, is not looked for."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.event import registry

from relay.db.inbox_transaction import Guard, TransactionEnded


class ListenersLeft(TransactionEnded):
    """The handler left event listeners on the inbox's connection, its engine, pool or
    dialect: taken off, its run rolled back and dead-lettered at once (each run of it would
    leave them again)."""


@contextmanager
def kept_off(conn: sa.Connection, guard: Guard) -> Iterator[None]:
    """A handler's run on ``conn``: the listeners it added there are taken off as it ends, and
    its run refused (``Guard.left``), naming the events (never what the listeners are)."""
    listened = registry._key_to_collection
    before = list(listened)  # its keys as they were: a copy of references, no hashing
    try:
        yield
    finally:
        if list(listened) != before:  # a comparison of the same keys by identity, mostly
            _left(conn, guard, listened.keys() - set(before))


def _left(conn: sa.Connection, guard: Guard, added: set[Any]) -> None:
    """The registry's ``added`` keys of what ``conn``'s handler reaches, taken off."""
    engine = conn.engine
    targets = {
        id(conn): "connection",
        id(engine): "engine",
        id(engine.pool): "pool",
        id(conn.dialect): "dialect",
    }
    left = []
    for key in [key for key in added if key[0] in targets]:
        left.append(f"{key[1]} on its {targets[key[0]]}")
        _take_off(key)
    if left:
        guard.left(
            ListenersLeft(
                f"the handler left SQLAlchemy event listeners ({', '.join(left)}), which "
                "would run at the inbox's own commit or rollback, past its guard: taken "
                "off, the run rolled back, not run again"
            )
        )


def _take_off(key: Any) -> None:
    """The listener of the registry's ``key`` taken out of every collection holding it, as
    ``event.remove`` does."""
    for collection_ref, listener_ref in registry._key_to_collection.pop(key, {}).items():
        collection, listener = collection_ref(), listener_ref()
        if collection is not None and listener is not None:
            held: Any = getattr(collection, "listeners", ())
            if listener in held:
                held.remove(listener)
            getattr(collection, "propagate", set()).discard(listener)
        registry._collection_to_key.get(collection_ref, {}).pop(listener_ref, None)
