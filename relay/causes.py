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

The relay stores each row's cause beside its last error (``stored_cause``, the outbox's
``cause`` column, migration 0018), from the whole error: 600 tenants' exchanges are 600
texts and one cause. ``grouped`` lists the causes a count read and those the console found
in its index of causes (``relay.db.console_counts``), the biggest first, the rest summed on
one line. Here, below both the console and the database, not in ``relay.console``: the
relay's settle stores causes, the database's reads group what they counted, and neither
imports anything of the console (``tests/unit/test_layers.py``).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from datetime import datetime

from relay.console_records import CauseGroup, Causes, Counted, Tally
from relay.constants import CAUSE_MAX_CHARS

# The causes the overview lists, the biggest first; the rest are one line with their rows
# and their number: thousands of causes (errors naming ids unquoted) must not make a page of
# thousands of lines, and no row may go unaccounted for.
CAUSES_LISTED = 50
# The cause shown for parked rows that have none yet (parked by a relay of a release before
# migration 0018, until a relay of this release sorts them: ``relay.db.causes``). Its quoted
# words make it a text no error's cause is (quoted text becomes '…'): an error reading as
# the label took its line, and its row was counted on none (an outside review).
UNSORTED = "(not sorted yet: 'parked by a relay of an earlier release')"
# Distinct errors whose cause is kept (``stored_cause``).
CAUSES_REMEMBERED = 4096

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


@functools.lru_cache(maxsize=CAUSES_REMEMBERED)
def stored_cause(last_error: str) -> str:
    """``last_error``'s cause as the outbox stores it beside the error (its ``cause``
    column, cut to ``CAUSE_MAX_CHARS``). Kept for the errors seen last: a settle parks
    hundreds of rows with one error, and its regular expressions need not run for each."""
    return cause_of(last_error)[:CAUSE_MAX_CHARS]


def grouped(
    tallies: Mapping[str | None, Tally],
    exact: bool,
    unread_before: datetime | None,
    *,
    found: Sequence[str | None] = (),
    found_all: bool = True,
    listed: int = CAUSES_LISTED,
) -> Causes:
    """The causes a count read (``tallies``: each cause's rows, None for rows not yet given
    one: ``UNSORTED``), and those ``found`` in the index of causes (None among them too)
    that it did not reach
    (each then "more than 0"); ``exact``: the count read every parked row (else each is at
    least what it read, and rows parked at or before ``unread_before`` were not read);
    ``found_all``: ``found`` holds every cause of the index (else more were not looked at)."""
    rows = {UNSORTED if cause is None else cause: tally for cause, tally in tallies.items()}
    groups = [
        CauseGroup(cause, Counted(t.rows, exact), t.first, t.last) for cause, t in rows.items()
    ]
    labels = (UNSORTED if cause is None else cause for cause in found)
    groups += [
        CauseGroup(label, Counted(0, exact=False, more=True), None, None)
        for label in labels
        if label not in rows
    ]
    groups.sort(key=lambda g: (-g.rows.rows, g.cause))
    rest = groups[listed:]
    parked = Counted(sum(t.rows for t in tallies.values()), exact, more=not exact)
    return Causes(
        listed=groups[:listed],
        other_rows=sum((g.rows for g in rest), Counted(0)),
        other_causes=Counted(len(rest), found_all, more=not found_all),
        parked=parked,
        unread_before=unread_before,
    )
