"""Pure: an audit entry's target as the audit page reads it. The log keeps a target as JSON
(``relay.db.console_actions.target_of``, ``relay.console.refusals.attempted``, a requeue's
queue and keys); the page says it in words: the rows by id (the first
``CONSOLE_NAMED_IDS``, and how many), or the filter field by field with the time the page
was drawn. What is not such JSON (an entry of an older release) is shown as it is."""

from __future__ import annotations

import json
from typing import Any

from relay.console_constants import CONSOLE_NAMED_IDS
from relay.console_records import named

# A filter's fields as the rows page labels them.
LABELS = {
    "cause": "cause",
    "reason": "reason contains",
    "exchange": "exchange",
    "routing_key": "routing key",
    "ordering_key": "ordering key",
    "message_id": "message id",
    "message_prefix": "message id starts with",
    "parked_before": "parked by",
    "parked_for": "parked at least",
}


def target_text(target: str) -> list[str]:
    """The target's lines, most telling first."""
    try:
        parsed = json.loads(target)
    except ValueError:
        return [target]
    if not isinstance(parsed, dict):
        return [target]
    lines = []
    if "filter" in parsed:
        lines.append(_filter(parsed["filter"]))
    if "ids" in parsed:
        ids = parsed["ids"]
        lines.append("rows: " + named(ids, int(parsed.get("ids_posted", len(ids)))))
    if "id" in parsed:
        changed = ", ".join(parsed.get("changed", []))
        lines.append(f"row {parsed['id']}" + (f", its {changed} changed" if changed else ""))
    if "queue" in parsed:
        keys = parsed.get("message_ids", [])
        shown = ", ".join(keys[:CONSOLE_NAMED_IDS]) + (
            " …" if len(keys) > CONSOLE_NAMED_IDS else ""
        )
        lines.append(
            f"queue {parsed['queue']}" + (f": {len(keys)} letters: {shown}" if keys else "")
        )
    if parsed.get("bound"):
        lines.append(f"as the page drawn at {parsed['bound']} showed")
    return lines or [target]


def _filter(chosen: Any) -> str:
    if not isinstance(chosen, dict) or not chosen:
        return "filter: every parked row"
    return "filter: " + "; ".join(f"{LABELS.get(k, k)} “{v}”" for k, v in chosen.items())
