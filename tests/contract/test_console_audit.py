"""The audit log's reads (``relay.db.console_rows.audit``) on every database: filtered by
user (an OpenID Connect user by their subject alone), action and time, a page at a time."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from relay.console_records import Actor, AuditFilter
from relay.db.console import ConsoleReads
from relay.db.console_actions import ConsoleActions
from relay.db.schema import console_audit

# One OpenID Connect user under two usernames (theirs to edit), one who took the first.
IRENE = Actor("irene (3f2a-sub)", "operator")
RENAMED = Actor("queen (3f2a-sub)", "operator")
IMPOSTOR = Actor("irene (9b1c-sub)", "operator")


def entries(reads: ConsoleReads, chosen: AuditFilter, limit: int = 50) -> list[tuple[str, str]]:
    return [(e.actor, e.action) for e in reads.audit(chosen, None, limit)]


def test_the_audit_filters_by_user_subject_action_and_time(database_url: str) -> None:
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    try:
        actions.record(IRENE, "replay", "{}", 1, "done")
        actions.record(RENAMED, "discard", "{}", 1, "done")
        actions.record(IMPOSTOR, "replay", "{}", 1, "done")
        actions.record(Actor("otto", "operator"), "replay", "{}", 0, "refused at act (403): x")
        engine = sa.create_engine(database_url)
        with engine.begin() as conn:  # the first entry a day old
            first = sa.select(sa.func.min(console_audit.c.id)).scalar_subquery()
            old = sa.select(console_audit.c.at).where(console_audit.c.id == first)
            at = conn.execute(old).scalar_one() - timedelta(days=1)
            conn.execute(console_audit.update().where(console_audit.c.id == first).values(at=at))
        engine.dispose()
        now = reads.now()
        # The subject finds both of irene's names, not the impostor who took her old one.
        by_subject = entries(reads, AuditFilter(actor="3f2a-sub"))
        by_name = entries(reads, AuditFilter(actor="irene (9b1c-sub)"))
        by_action = entries(reads, AuditFilter(action="discard"))
        recent = entries(reads, AuditFilter(since=now - timedelta(hours=1)))
        older = entries(reads, AuditFilter(until=now - timedelta(hours=1)))
        nothing = entries(reads, AuditFilter(actor="irene"))  # a username alone: anyone's
        like = entries(reads, AuditFilter(actor="%"))  # matched as text
    finally:
        reads.close()
        actions.close()
    assert by_subject == [(RENAMED.name, "discard"), (IRENE.name, "replay")]
    assert by_name == [(IMPOSTOR.name, "replay")]
    assert by_action == [(RENAMED.name, "discard")]
    assert [a for a, _ in recent] == ["otto", IMPOSTOR.name, RENAMED.name]
    assert older == [(IRENE.name, "replay")]
    assert nothing == [] and like == []


def test_audit_pages_walk_every_matching_entry_once_newest_first(database_url: str) -> None:
    reads, actions = ConsoleReads(database_url), ConsoleActions(database_url)
    try:
        for n in range(7):
            actions.record(Actor("otto" if n % 2 else "ada", "admin"), "replay", "{}", n, "done")
        seen: list[int] = []
        after = None
        while page := reads.audit(AuditFilter(actor="otto"), after, 2):
            seen += [e.rows for e in page]
            after = page[-1].id
    finally:
        reads.close()
        actions.close()
    assert seen == [5, 3, 1]
