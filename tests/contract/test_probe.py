"""The probe of new rows (``relay.db.probe``) on every database: it wakes its relay when the
newest id grows, saying from which id, and not when the newest rows are acked and deleted."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from devtools.outbox import insert
from devtools.servers import wait_until
from relay.db.probe import NewRowsProbe
from relay.db.schema import outbox


class Looks(threading.Event):
    """The probe's stop event, counting its looks (it waits on it after each)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def wait(self, timeout: float | None = None) -> bool:
        self.count += 1
        return super().wait(timeout)


def test_the_probe_wakes_for_new_ids_only_not_for_deleted_ones(database_url: str) -> None:
    """At a live stream the outbox is mostly empty: every settle deletes its newest rows,
    and the newest id falls. Each fall woke the relay for an empty claim: two claims a
    row. It wakes when the id grows, from the highest seen before."""
    probe = NewRowsProbe(database_url)
    woken: list[tuple[int | None, int | None]] = []
    looks, listening = Looks(), threading.Event()
    listening.set()
    watching = threading.Thread(
        target=probe.watch, args=(lambda *ids: woken.append(ids), 0.005, looks, listening)
    )
    engine = sa.create_engine(database_url)
    watching.start()
    try:
        wait_until(lambda: len(woken) == 1, 30, "the first look")
        insert(engine, [{"message_id": "a", "payload": b"x"}])
        wait_until(lambda: len(woken) == 2, 30, "a woken for")
        with engine.begin() as conn:  # acked and deleted, as a settle does
            conn.execute(sa.delete(outbox))
        deleted_at = looks.count
        wait_until(lambda: looks.count >= deleted_at + 2, 30, "a look after the delete")
        insert(engine, [{"message_id": "b", "payload": b"x"}])
        wait_until(lambda: len(woken) == 3, 30, "b woken for")
    finally:
        looks.set()
        watching.join()
        probe.close()
        engine.dispose()
    with_ids = [woken[1][1], woken[2][1]]
    assert woken == [(None, None), (None, with_ids[0]), (with_ids[0], with_ids[1])]
    assert with_ids[0] is not None and with_ids[1] is not None and with_ids[1] > with_ids[0]
