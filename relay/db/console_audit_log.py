"""What the console's audit log keeps of a change, and its log line: the actions' names,
a change's target (the ids, or the filter and when its page was drawn) and a failed change's
result (``relay.db.console_actions`` writes the entries)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from relay.console_records import Actor, ArchiveFilter, ParkedFilter

log = logging.getLogger(__name__)

REPLAY = "replay"
DISCARD = "discard"
RESTORE = "restore"
EDIT = "edit_and_replay"
REQUEUE = "requeue_dead_letters"
PURGE = "purge_dead_letters"
# A refused attempt's action when the form posted none of the console's.
UNKNOWN = "unknown"
# The actions an audit entry may name, for the audit page's filter.
AUDITED = (REPLAY, DISCARD, RESTORE, EDIT, REQUEUE, PURGE, UNKNOWN)


def target_of(
    ids: Sequence[int] | None, chosen: ParkedFilter | ArchiveFilter | None, bound: Any
) -> str:
    """An action's target as the audit log keeps it: the ids, or the filter and its bound."""
    if ids is not None:
        return json.dumps({"ids": list(ids), "bound": _text(bound)})
    return json.dumps({"filter": chosen.described() if chosen else {}, "bound": _text(bound)})


def _text(bound: Any) -> str | None:
    return None if bound is None else bound.isoformat()


def failed(changed: int, exc: BaseException) -> str:
    """A failed change's result as the audit log keeps it: what committed, and the error's
    class (never its message, which may quote a statement's parameters)."""
    return f"failed after {changed} rows: {type(exc).__name__}"


def logged(actor: Actor, action: str, target: str, rows: int, result: str) -> None:
    """A change's log line: its audit entry's fields, never a value of a row."""
    log.info(
        "console %s by %s (%s): %d rows, %s",
        action,
        actor.name,
        actor.role,
        rows,
        result,
        extra={
            "action": "console_change",
            "change": action,
            "actor": actor.name,
            "role": actor.role,
            "target": target,
            "rows": rows,
            "result": result,
        },
    )
