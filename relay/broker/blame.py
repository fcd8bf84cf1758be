"""Blame for a channel the broker closed: which unconfirmed rows caused it, and what the close
says about their destination. Pure: reply code and text in, a verdict out (the quarantine,
``relay.broker.quarantine``, keeps the suspects it makes).

The broker closes the channel when a publish breaks one of its rules, and every unconfirmed
publish on it is lost with it. Some close texts name the cause: ``404 NOT_FOUND - no exchange
'x'`` and ``403 ACCESS_REFUSED - access to exchange 'x' ... refused`` name an exchange (its
rows are the culprits, and the exchange is broken, see ``relay.broker.destinations``); ``406
PRECONDITION_FAILED - message size ... larger than configured max size N`` names a size. The
rows lost with such a close are innocent and simply due again. Other texts name nothing (a
403 for an internal exchange, an unknown rule): then every lost row is a *suspect*, and a
suspect is published alone, with nothing else in flight. If the channel closes then, the row
published alone is the culprit for certain.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from relay.broker.destinations import refused
from relay.records import OutboxRow

_NO_EXCHANGE = re.compile(r"no exchange '(?P<name>[^']*)'")
_NO_ACCESS = re.compile(r"access to exchange '(?P<name>[^']*)'")
_TOO_LARGE = re.compile(r"larger than configured max size (?P<size>\d+)")
# In the outcome of every suspect: what operators read in its last_error. The mark itself is
# ``Settlement.suspect``, stored in a column of its own.
CLOSED_BY_BROKER = "channel closed by the broker"


@dataclass(frozen=True, slots=True)
class Verdict:
    culprit: Callable[[OutboxRow], bool] | None  # None: no row can be blamed
    culprit_reason: str  # the culprits' outcome detail (they are charged an attempt)
    innocent_reason: str  # the other lost rows' (due again at once)
    exchange: str | None = None  # the exchange the close shows broken
    max_message_size: int | None = None  # the broker's limit, when the close told it

    @property
    def suspects(self) -> bool:
        """The rows blamed become suspects: the culprits, or, with none, every lost row. A
        close that names an exchange blames its rows for certain."""
        return self.exchange is None


def blame(code: int, text: str, alone: OutboxRow | None) -> Verdict:
    """The verdict on a close with ``code`` and ``text``; ``alone`` is the row that was
    published with nothing else in flight, if one was."""
    close = f"{code} {text}"
    suspect = f"{CLOSED_BY_BROKER}: {close}"
    named = (code == 404 and _NO_EXCHANGE.search(text)) or (code == 403 and _NO_ACCESS.search(text))
    exchange = None
    if named:
        exchange = "" if named["name"] == "amq.default" else named["name"]
    too_large = _TOO_LARGE.search(text) if code == 406 else None
    limit = int(too_large["size"]) if too_large else None
    innocent = f"lost with a channel the broker closed for another row: {close}"
    if exchange is not None:
        name = exchange
        culprit_reason = refused(name, close)
        if alone is not None:
            return Verdict(lambda row: row is alone, culprit_reason, innocent, name, limit)
        return Verdict(lambda row: row.exchange == name, culprit_reason, innocent, name, limit)
    if alone is not None:
        return Verdict(lambda row: row is alone, suspect, innocent, None, limit)
    if limit is not None:
        size = limit
        return Verdict(lambda row: len(row.payload) > size, suspect, innocent, None, limit)
    return Verdict(None, "", suspect)
