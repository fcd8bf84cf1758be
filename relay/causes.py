"""Pure: a parked row's cause, from its last error: the error's class and the stable part
of its message, so that rows parked for one reason group together whatever ids, numbers or
names their messages carry.

The relay writes ``outcome: detail`` (``relay.settle``: ``returned: 312 NO_ROUTE``,
``failed: 404 NOT_FOUND - no exchange 'orders-7' in vhost '/'``); the inbox writes
``Type: message``. The class is the part before the first colon, when it is one word; in
the rest, quoted text becomes ``'…'`` and numbers, hex and UUIDs ``#``, except AMQP's reply
codes, which are the reason itself: three digits before the code's name (``312 NO_ROUTE``,
``404 NOT_FOUND``, ``406 PRECONDITION_FAILED``); any other number, three digits or not
(``payload of 512 bytes``), is taken out.

``grouped`` makes causes of the reasons a count read (``relay.db.console_counts``): every
reason is in a cause, however many distinct texts there are (600 tenants' exchanges are 600
texts and one cause), and the causes beyond the biggest are summed on one line. Here, below
both the console and the database, not in ``relay.console``: the database's reads group
what they counted, and import nothing of the console (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Mapping
from datetime import datetime

from relay.console_records import CauseGroup, Causes, Counted, Tally

# The causes the overview lists, the biggest first; the rest are one line with their rows
# and their number: thousands of causes (errors naming ids unquoted) must not make a page of
# thousands of lines, and no row may go unaccounted for.
CAUSES_LISTED = 50

_CLASS = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*:\s*(.*)$", re.DOTALL)
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_UUID = re.compile(r"\b[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}\b")
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b(?=[0-9a-fA-F]*\d)[0-9a-fA-F]{8,}\b")
_REPLY_CODE = re.compile(r"\d{3}")
_REPLY_NAME = re.compile(r" [A-Z][A-Z_]*[A-Z]\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_SPACES = re.compile(r"\s+")


def _number(match: re.Match[str]) -> str:
    code = _REPLY_CODE.fullmatch(match[0]) and _REPLY_NAME.match(match.string, match.end())
    return match[0] if code else "#"


def cause_of(last_error: str) -> str:
    """``last_error``'s cause: ``class: stable message`` (or the stable message alone)."""
    found = _CLASS.match(last_error)
    kind, message = (found[1], found[2]) if found else ("", last_error)
    stable = _QUOTED.sub("'…'", message)
    stable = _UUID.sub("#", stable)
    stable = _HEX.sub("#", stable)
    stable = _NUMBER.sub(_number, stable)
    stable = _SPACES.sub(" ", stable).strip()
    if not kind:
        return stable or "(no error)"
    return f"{kind}: {stable}" if stable else kind


def grouped(
    tallies: Mapping[str, Tally],
    exact: bool,
    unread_before: datetime | None,
    readable: Callable[[str], str] = str,
    listed: int = CAUSES_LISTED,
) -> Causes:
    """The causes of the reasons (prefixes) ``tallies`` counted, each of its prefixes'
    rows; ``exact``: the count read every parked row (else each is at least what it read,
    and rows parked at or before ``unread_before`` were not read). ``readable``: a prefix as
    text to read its cause from."""
    parts: dict[str, list[tuple[str, Tally]]] = defaultdict(list)
    for prefix, tally in tallies.items():
        parts[cause_of(readable(prefix))].append((prefix, tally))
    groups = [
        CauseGroup(
            cause=cause,
            prefixes=tuple(sorted(prefix for prefix, _ in found)),
            rows=Counted(sum(t.rows for _, t in found), exact),
            first_parked=min((t.first for _, t in found if t.first), default=None),
            last_parked=max((t.last for _, t in found if t.last), default=None),
        )
        for cause, found in parts.items()
    ]
    groups.sort(key=lambda g: (-g.rows.rows, g.cause))
    rest = groups[listed:]
    parked = Counted(sum(t.rows for t in tallies.values()), exact, more=not exact)
    return Causes(
        listed=groups[:listed],
        other_rows=sum((g.rows for g in rest), Counted(0)),
        other_causes=len(rest),
        parked=parked,
        unread_before=unread_before,
        prefixes={g.cause: g.prefixes for g in groups},
    )
