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
    "discarded_by": "discarded by",
    "since": "from",
    "until": "to",
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
        lines.append(f"queue {parsed['queue']}" + _letters(parsed))
    if parsed.get("bound"):
        lines.append(f"as the page drawn at {parsed['bound']} showed")
    return lines or [target]


def _letters(parsed: dict[str, Any]) -> str:
    """Which dead letters a change took: those ticked (their digests; an older release's
    message ids), those whose reason holds a text, or all."""
    scope = parsed.get("scope")
    if scope == "reason":
        return f": letters whose reason contains “{parsed.get('reason', '')}”"
    if scope == "all":
        return ": every letter"
    keys = parsed.get("letters") or parsed.get("message_ids") or []
    if not isinstance(keys, list) or not keys:
        return ""
    shown = ", ".join(str(k) for k in keys[:CONSOLE_NAMED_IDS])
    return f": {len(keys)} letters: {shown}" + (" …" if len(keys) > CONSOLE_NAMED_IDS else "")


def _filter(chosen: Any) -> str:
    if not isinstance(chosen, dict) or not chosen:
        return "filter: every parked row"
    return "filter: " + "; ".join(f"{LABELS.get(k, k)} “{v}”" for k, v in chosen.items())
