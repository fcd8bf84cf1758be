"""Pure: a time as the console's pages show it: how long ago, against the database's time
when the page was drawn (``3 min ago``), in a ``<time>`` element whose title is the absolute
time in UTC, named so (``2026-11-29 12:05:03 UTC``). Drawn by the server: the page reads
the same without its script. Against the database's clock, not the browser's or the
console host's, which may differ from the one that stamped the rows."""

from __future__ import annotations

from datetime import UTC, datetime

from markupsafe import Markup, escape

# Seconds per unit, the largest first: an age is said in the largest unit it has one of.
_UNITS = (("d", 86400), ("h", 3600), ("min", 60), ("s", 1))


def ago(then: datetime, now: datetime) -> str:
    """``then`` relative to ``now``: ``12 s ago``, ``3 min ago``, ``2 h ago``, ``5 d ago``
    (whole units, rounded down), ``in 3 min`` for a time still to come."""
    seconds = int((now - then).total_seconds())
    for unit, size in _UNITS:
        if abs(seconds) >= size:
            amount = abs(seconds) // size
            return f"{amount} {unit} ago" if seconds > 0 else f"in {amount} {unit}"
    return "now"


def utc(then: datetime) -> str:
    return then.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def when(then: datetime | None, now: datetime) -> Markup:
    """A ``<time>`` element: how long ago, the absolute UTC time as its title and its
    ``datetime`` (empty for no time)."""
    if then is None:
        return Markup("")
    return Markup('<time datetime="{}" title="{}">{}</time>').format(
        escape(then.astimezone(UTC).isoformat()), escape(utc(then)), escape(ago(then, now))
    )
